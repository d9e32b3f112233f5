# Export: each model export.models names (or the deployed one) to ONNX (fp32 and fused), its int8 and 4-bit graphs,
# CoreML packages; the full-size architectures through the same path (sizes and latency), BERT-base's int8 graph
# with the searched recipe, the peers and the GEMM floor graph the benchmark times; the app bundle.


# Target deploy: the QA model of deploy.model, taken as it is; its dev answers are what every export is gated on.
rule deploy_model:
    input:
        data=rules.prepare_data.output[0],
        model=folder_files(CFG.deploy.model) if "deploy.model" in LOCAL_PATHS else [],  # an edit inside reruns it
        code=code("deploy-model"),
    output:
        directory(f"{ROOT}/deployed_model"),
    params:
        cfg=stage_config("seed", "squad", "export", "deploy"),  # export: the CoreML lengths the model must fit
    log:
        log_file("deploy_model"),
    benchmark:
        benchmark_file("deploy_model")
    threads: workflow.cores
    resources:
        **EXPORT_RESOURCES,
    shell:
        stage_shell("deploy-model", data_dir="{input.data:q}", out_dir="{output:q}", threads_variable="OMP_NUM_THREADS")


rule export_onnx:
    input:
        model=lambda wildcards: f"{ROOT}/{EXPORTED_MODELS[wildcards.model]}",
        data=rules.prepare_data.output[0],
        code=code("export-onnx"),
    output:
        directory(f"{ROOT}/onnx/{{model}}"),
    wildcard_constraints:
        model="|".join(EXPORTED_MODELS),
    params:
        cfg=stage_config(*EXPORT_SECTIONS),
    log:
        log_file("export_onnx_{model}"),
    benchmark:
        benchmark_file("export_onnx_{model}")
    priority: export_priority
    threads: 1
    resources:
        **EXPORT_RESOURCES,
    shell:
        stage_shell("export-onnx", model_dir="{input.model:q}", data_dir="{input.data:q}", out_dir="{output:q}",
                    threads_variable="OMP_NUM_THREADS")


# Scores its int8 variants on dev and times them at 1 thread to pick the bundle's. One core: scoring the small models
# gains little from a second thread, and two of these side by side finish sooner than one after the other with every
# core. The variants are timed round-robin in one process (a neighbour on the other core slows each alike), and
# medians within export.quantize.latency_tie_fraction are a tie broken by size, so the choice does not follow noise.
rule quantize_onnx:
    input:
        onnx=f"{ROOT}/onnx/{{model}}",
        model=lambda wildcards: f"{ROOT}/{EXPORTED_MODELS[wildcards.model]}",
        data=rules.prepare_data.output[0],
        code=code("quantize-onnx"),
    output:
        directory(f"{ROOT}/quantized/{{model}}"),
    wildcard_constraints:
        model="|".join(EXPORTED_MODELS),
    params:
        cfg=stage_config(*EXPORT_SECTIONS),
    log:
        log_file("quantize_onnx_{model}"),
    benchmark:
        benchmark_file("quantize_onnx_{model}")
    priority: export_priority
    threads: 1
    resources:
        **EXPORT_RESOURCES,
    shell:
        stage_shell("quantize-onnx", onnx_dir="{input.onnx:q}", model_dir="{input.model:q}", data_dir="{input.data:q}",
                    out_dir="{output:q}", threads="{threads}", threads_variable="OMP_NUM_THREADS")


rule export_coreml:
    input:
        model=lambda wildcards: f"{ROOT}/{PHONE_MODELS[wildcards.model]}",
        data=rules.prepare_data.output[0],
        code=code("export-coreml"),
    output:
        directory(f"{ROOT}/coreml/{{model}}"),
    wildcard_constraints:
        model="|".join(PHONE_MODELS),
    params:
        cfg=stage_config(*EXPORT_SECTIONS),
    log:
        log_file("export_coreml_{model}"),
    benchmark:
        benchmark_file("export_coreml_{model}")
    priority: export_priority
    threads: 1
    resources:
        **EXPORT_RESOURCES,
    shell:
        stage_shell("export-coreml", model_dir="{input.model:q}", data_dir="{input.data:q}", out_dir="{output:q}",
                    threads_variable="OMP_NUM_THREADS")


# Android NPU graphs: static int8 with fixed shapes, gated on the CPU execution provider and checked on the QNN HTP
# emulation (pipeline/export/npu_graph.py). One thread: it runs beside the other exports.
rule export_npu:
    input:
        model=lambda wildcards: f"{ROOT}/{PHONE_MODELS[wildcards.model]}",
        data=rules.prepare_data.output[0],
        code=code("export-npu"),
    output:
        directory(f"{ROOT}/npu/{{model}}"),
    wildcard_constraints:
        model="|".join(PHONE_MODELS),
    params:
        cfg=stage_config(*EXPORT_SECTIONS),
    log:
        log_file("export_npu_{model}"),
    benchmark:
        benchmark_file("export_npu_{model}")
    priority: export_priority
    threads: 1
    resources:
        **EXPORT_RESOURCES,
    shell:
        stage_shell("export-npu", model_dir="{input.model:q}", data_dir="{input.data:q}", out_dir="{output:q}",
                    threads_variable="OMP_NUM_THREADS")


# The full-size architectures need nothing from training (random weights): they fill idle cores. The data folder is
# an ordering input only (the stage does not read it): started at once, a 1-thread full-size export takes the core
# that the 2-thread tokenizer and teacher pretraining wait for (2:18 of the critical path on the AMD EPYC with AVX2
# only); after prepare_data, those take both cores first and the full-size exports run beside 1-thread training.
rule export_full_size:
    input:
        data=rules.prepare_data.output[0],
        code=code("export-full-size"),
    output:
        directory(f"{ROOT}/full_size/{{architecture}}"),
    wildcard_constraints:
        architecture="distilbert|bert-base",
    params:
        cfg=stage_config(*EXPORT_SECTIONS),
    log:
        log_file("export_full_size_{architecture}"),
    benchmark:
        benchmark_file("export_full_size_{architecture}")
    priority: FULL_SIZE_FIRST  # int8_search (and so the bundle) waits for the DistilBERT one: before the other exports
    threads: 1
    resources:
        **EXPORT_RESOURCES,
    shell:
        stage_shell("export-full-size", architecture="{wildcards.architecture:q}", out_dir="{output:q}",
                    threads_variable="OMP_NUM_THREADS")


# The int8 recipe the search chose (rule int8_search, on the full-size DistilBERT), built for the other full-size
# architectures: BERT-base's int8 graph, the speed baseline on the same int8 path. It reads only the search's
# choice.json, so a search that picks the same recipe again rebuilds nothing on a later run (Snakemake compares the
# content of a small input whose time changed).
rule export_full_size_int8:
    input:
        full_size=f"{ROOT}/full_size/{{architecture}}",
        choice=f"{ROOT}/int8_search/choice.json",
        code=code("export-full-size-int8"),
    output:
        directory(f"{ROOT}/full_size_int8/{{architecture}}"),
    wildcard_constraints:
        architecture="bert-base",
    params:
        cfg=stage_config(*EXPORT_SECTIONS)  # export is checked against squad,
    log:
        log_file("export_full_size_int8_{architecture}"),
    benchmark:
        benchmark_file("export_full_size_int8_{architecture}")
    threads: 1
    resources:
        **EXPORT_RESOURCES,
    shell:
        stage_shell("export-full-size-int8", full_size_dir="{input.full_size:q}", choice_path="{input.choice:q}",
                    out_dir="{output:q}", threads_variable="OMP_NUM_THREADS")


# The int8 paths a user would otherwise pick (torch.ao dynamic int8, optimum's ORTQuantizer), for the full-size
# architectures whose peers benchmark.timed_full_size names; the benchmark times them beside ours.
rule export_peers:
    input:
        full_size=f"{ROOT}/full_size/{{architecture}}",
        code=code("export-peers"),
    output:
        directory(f"{ROOT}/peers/{{architecture}}"),
    wildcard_constraints:
        architecture="distilbert|bert-base",
    params:
        cfg=stage_config("seed"),
        peers=lambda wildcards: ",".join(PEERS_BUILT[wildcards.architecture]),
    log:
        log_file("export_peers_{architecture}"),
    benchmark:
        benchmark_file("export_peers_{architecture}")
    priority: FILLER
    threads: 1
    resources:
        **EXPORT_RESOURCES,
    shell:
        stage_shell("export-peers", full_size_dir="{input.full_size:q}", peers="{params.peers:q}", out_dir="{output:q}",
                    threads_variable="OMP_NUM_THREADS")


# The GEMM floor: the full-size DistilBERT int8 graph's MatMulInteger nodes alone, at the longest benchmarked length.
rule export_gemm_floor:
    input:
        full_size=f"{ROOT}/full_size/distilbert",
        code=code("export-gemm-floor"),
    output:
        directory(f"{ROOT}/gemm_floor"),
    params:
        cfg=stage_config("seed"),
        sequence_length=max(CFG.benchmark.sequence_lengths),
    log:
        log_file("export_gemm_floor"),
    benchmark:
        benchmark_file("export_gemm_floor")
    priority: FILLER
    threads: 1
    resources:
        **EXPORT_RESOURCES,
    shell:
        stage_shell("export-gemm-floor", full_size_dir="{input.full_size:q}",
                    sequence_length="{params.sequence_length}", out_dir="{output:q}")


rule bundle:
    input:
        onnx=f"{ROOT}/onnx/{BUNDLED_MODEL}",
        quantized=f"{ROOT}/quantized/{BUNDLED_MODEL}",
        coreml=f"{ROOT}/coreml/{BUNDLED_MODEL}",
        npu=[f"{ROOT}/npu/{BUNDLED_MODEL}"] if NPU_BUILT else [],
        model=f"{ROOT}/{EXPORTED_MODELS[BUNDLED_MODEL]}",
        data=rules.prepare_data.output[0],
        code=code("bundle"),
    output:
        directory(f"{ROOT}/bundle"),
    params:
        cfg=stage_config(*EXPORT_SECTIONS),
        npu=lambda wildcards, input: str(input.npu) if input.npu else "",  # '': no Android NPU graphs
    log:
        log_file("bundle"),
    benchmark:
        benchmark_file("bundle")
    threads: 1
    resources:
        **LIGHT_RESOURCES,
    shell:
        stage_shell("bundle", onnx_dir="{input.onnx:q}", quantized_dir="{input.quantized:q}", coreml_dir="{input.coreml:q}",
                    npu_dir="{params.npu:q}", model_dir="{input.model:q}", data_dir="{input.data:q}", out_dir="{output:q}",
                    threads_variable="OMP_NUM_THREADS")
