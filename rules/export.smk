# Export: each trained model (or the deployed one) to ONNX (fp32 and fused), its int8 and 4-bit graphs, CoreML
# packages; the full-size architectures through the same path (sizes and latency); the app bundle.


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
    threads: 1
    resources:
        **EXPORT_RESOURCES,
    shell:
        stage_shell("export-onnx", model_dir="{input.model:q}", data_dir="{input.data:q}", out_dir="{output:q}",
                    threads_variable="OMP_NUM_THREADS")


# Times its int8 variants to pick the bundle's: it takes every core, so nothing runs beside the timed runs.
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
    threads: workflow.cores
    resources:
        **EXPORT_RESOURCES,
    shell:
        stage_shell("quantize-onnx", onnx_dir="{input.onnx:q}", model_dir="{input.model:q}", data_dir="{input.data:q}",
                    out_dir="{output:q}", threads="{threads}", threads_variable="OMP_NUM_THREADS")


rule export_coreml:
    input:
        model=lambda wildcards: f"{ROOT}/{EXPORTED_MODELS[wildcards.model]}",
        data=rules.prepare_data.output[0],
        code=code("export-coreml"),
    output:
        directory(f"{ROOT}/coreml/{{model}}"),
    wildcard_constraints:
        model="|".join(EXPORTED_MODELS),
    params:
        cfg=stage_config(*EXPORT_SECTIONS),
    log:
        log_file("export_coreml_{model}"),
    benchmark:
        benchmark_file("export_coreml_{model}")
    threads: 1
    resources:
        **EXPORT_RESOURCES,
    shell:
        stage_shell("export-coreml", model_dir="{input.model:q}", data_dir="{input.data:q}", out_dir="{output:q}",
                    threads_variable="OMP_NUM_THREADS")


# The full-size architectures need nothing from training (random weights): they fill idle cores.
rule export_full_size:
    input:
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
    priority: FILLER
    threads: 1
    resources:
        **EXPORT_RESOURCES,
    shell:
        stage_shell("export-full-size", architecture="{wildcards.architecture:q}", out_dir="{output:q}",
                    threads_variable="OMP_NUM_THREADS")


rule bundle:
    input:
        quantized=f"{ROOT}/quantized/{BUNDLED_MODEL}",
        coreml=f"{ROOT}/coreml/{BUNDLED_MODEL}",
        model=f"{ROOT}/{EXPORTED_MODELS[BUNDLED_MODEL]}",
        data=rules.prepare_data.output[0],
        code=code("bundle"),
    output:
        directory(f"{ROOT}/bundle"),
    params:
        cfg=stage_config(*EXPORT_SECTIONS),
    log:
        log_file("bundle"),
    benchmark:
        benchmark_file("bundle")
    threads: 1
    resources:
        **LIGHT_RESOURCES,
    shell:
        stage_shell("bundle", quantized_dir="{input.quantized:q}", coreml_dir="{input.coreml:q}",
                    model_dir="{input.model:q}", data_dir="{input.data:q}", out_dir="{output:q}",
                    threads_variable="OMP_NUM_THREADS")
