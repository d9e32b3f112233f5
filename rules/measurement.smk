# Measurement: every artifact timed and sized on this machine (Python, and JavaScript in Node and Chromium), and
# the report with its goals.


# Which int8 recipe and session options the full-size DistilBERT runs fastest with, among the recipes that passed
# their gates on every exported model (onnxruntime's default options where they are within the latency tie). It
# times: it takes every core, so nothing runs beside the timed runs.
rule int8_search:
    input:
        full_size=f"{ROOT}/full_size/distilbert",
        quantized=expand(f"{ROOT}/quantized/{{model}}", model=list(EXPORTED_MODELS)),
        code=code("int8-search"),
    output:
        search=f"{ROOT}/int8_search/int8_search.json",
        choice=f"{ROOT}/int8_search/choice.json",
    params:
        cfg=search_config(),
        root=ROOT,
        out_dir=f"{ROOT}/int8_search",
    log:
        log_file("int8_search"),
    benchmark:
        benchmark_file("int8_search")
    threads: workflow.cores
    resources:
        **EXPORT_RESOURCES,
    shell:
        stage_shell("int8-search", root="{params.root:q}", out_dir="{params.out_dir:q}")


# Times every artifact the export rules built: it takes every core, so nothing runs beside the timed runs.
rule benchmark:
    input:
        exports=expand(f"{ROOT}/{{kind}}/{{model}}", kind=["onnx", "quantized"], model=list(EXPORTED_MODELS)),
        coreml=expand(f"{ROOT}/coreml/{{model}}", model=list(PHONE_MODELS)),
        npu=expand(f"{ROOT}/npu/{{model}}", model=list(PHONE_MODELS) if NPU_BUILT else []),
        full_size=expand(f"{ROOT}/full_size/{{architecture}}", architecture=FULL_SIZE),
        int8_search=rules.int8_search.output.search if INT8_SEARCHED else [],
        full_size_int8=expand(f"{ROOT}/full_size_int8/{{architecture}}", architecture=SEARCHED_INT8_BUILT_FOR),
        peers=expand(f"{ROOT}/peers/{{architecture}}", architecture=list(PEERS_BUILT)),
        gemm_floor=f"{ROOT}/gemm_floor" if INT8_SEARCHED else [],
        bundle=rules.bundle.output[0],
        code=code("benchmark"),
    output:
        directory(f"{ROOT}/benchmark"),
    params:
        cfg=stage_config("seed", "squad", "export", "benchmark", "deploy", export_models=True),
        root=ROOT,
    log:
        log_file("benchmark"),
    benchmark:
        benchmark_file("benchmark")
    threads: workflow.cores
    resources:
        **EXPORT_RESOURCES,
    shell:
        stage_shell("benchmark", root="{params.root:q}", out_dir="{output:q}")


rule benchmark_web:
    input:
        bundle=rules.bundle.output[0],
        after_benchmark=rules.benchmark.output[0],  # never timed beside it; it names the searched int8 graph
        code=code("benchmark-web", *WEB_CLIENT_FILES),  # and the JavaScript it runs
    output:
        f"{ROOT}/benchmark_web/benchmark_web.json",
    params:
        cfg=stage_config("benchmark", "deploy"),
        root=ROOT,
    log:
        log_file("benchmark_web"),
    benchmark:
        benchmark_file("benchmark_web")
    threads: workflow.cores
    resources:
        **LIGHT_RESOURCES,
    shell:
        stage_shell("benchmark-web", root="{params.root:q}", out="{output:q}")


WEB_BENCHMARK = rules.benchmark_web.output[0] if CFG.benchmark.javascript else []


rule report:
    input:
        benchmark=rules.benchmark.output[0],
        models=[f"{ROOT}/{stage}" for stage in TRAINED_MODELS.values()],  # their scores, exported or not
        web=WEB_BENCHMARK,
        schema=str(Path(workflow.basedir) / "configs" / "summary.schema.json"),
        code=code("report"),
    output:
        summary=report(f"{ROOT}/report/summary.json", category="Summary", caption=caption("summary")),
        markdown=f"{ROOT}/report/report.md",
        f1_vs_size=report(f"{ROOT}/report/f1_vs_size.png", category="Accuracy", caption=caption("f1_vs_size")),
        f1_vs_latency=report(f"{ROOT}/report/f1_vs_latency.png", category="Accuracy", caption=caption("f1_vs_latency")),
        # a deployed model trained elsewhere: no training logs to draw
        **({} if DEPLOYING else {"loss_curves": report(f"{ROOT}/report/loss_curves.png", category="Training",
                                                       caption=caption("loss_curves"))}),
    params:
        cfg=stage_config("squad", "export", "benchmark", "deploy", export_models=True),
        root=ROOT,
        out_dir=f"{ROOT}/report",
        web=lambda wildcards, input: str(input.web) if input.web else "",  # '': no JavaScript timings
    log:
        log_file("report"),
    benchmark:
        benchmark_file("report")
    threads: 1
    resources:
        **LIGHT_RESOURCES,
    shell:
        stage_shell("report", root="{params.root:q}", benchmark="{input.benchmark:q}/benchmark.json",
                    web_benchmark="{params.web:q}", out_dir="{params.out_dir:q}")
