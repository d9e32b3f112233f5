# Data and teacher: the SQuAD files and MLM corpus, the tokenizer, the corpus tokenized once into memory-mapped
# ids, and the teacher (MLM-pretrained from scratch unless teacher.pretrained names one, then fine-tuned on SQuAD).


rule prepare_data:
    input:
        data_files=DATA_FILES,
        code=code("prepare-data"),
    output:
        directory(f"{ROOT}/data"),
    params:
        cfg=stage_config("seed", "data", "deploy"),  # a deploy reads the dev set only
    log:
        log_file("prepare_data"),
    benchmark:
        benchmark_file("prepare_data")
    priority: CRITICAL
    threads: 1
    resources:
        **DATA_RESOURCES,
    shell:
        stage_shell("prepare-data", out_dir="{output:q}")


rule tokenizer:
    input:
        data=rules.prepare_data.output[0],
        corpus_file=CORPUS_FILES,
        code=code("tokenizer"),
    output:
        directory(f"{ROOT}/tokenizer"),
    params:
        cfg=stage_config("seed", "data", "tokenizer", "teacher"),  # the corpus source and its hold-out
    log:
        log_file("tokenizer"),
    benchmark:
        benchmark_file("tokenizer")
    priority: CRITICAL
    threads: CFG.compute.data_threads  # the WordPiece trainer's own thread pool
    resources:
        **DATA_RESOURCES,
    shell:
        stage_shell("tokenizer", data_dir="{input.data:q}", out_dir="{output:q}", threads_variable="RAYON_NUM_THREADS")


# The corpus, tokenized once into memory-mapped ids (one worker process per thread); every MLM stage and rank
# reads these files.
rule tokenize_corpus:
    input:
        data=rules.prepare_data.output[0],
        tokenizer=rules.tokenizer.output[0],
        corpus_file=CORPUS_FILES,
        code=code("tokenize-corpus"),
    output:
        directory(f"{ROOT}/corpus"),
    params:
        cfg=stage_config("seed", "data"),
    log:
        log_file("tokenize_corpus"),
    benchmark:
        benchmark_file("tokenize_corpus")
    priority: CRITICAL
    threads: CFG.compute.data_threads
    resources:
        **DATA_RESOURCES,
    shell:
        stage_shell("tokenize-corpus", data_dir="{input.data:q}", tokenizer_dir="{input.tokenizer:q}",
                    out_dir="{output:q}", workers="{threads}")


if TEACHER_FROM_SCRATCH:

    rule teacher_pretrain:
        input:
            corpus=rules.tokenize_corpus.output[0],
            tokenizer=rules.tokenizer.output[0],
            code=code("teacher-pretrain"),
        output:
            directory(f"{ROOT}/teacher_pretrain"),
        params:
            cfg=training_config("seed", "teacher"),
            work=f"{ROOT}/work/teacher_pretrain",
        log:
            log_file("teacher_pretrain"),
        benchmark:
            benchmark_file("teacher_pretrain")
        priority: CRITICAL
        threads: training_threads(CFG.teacher.pretrain, workflow.cores)
        resources:
            **TRAIN_RESOURCES,
        shell:
            stage_shell("teacher-pretrain", corpus_dir="{input.corpus:q}", tokenizer_dir="{input.tokenizer:q}",
                        out_dir="{output:q}", work_dir="{params.work:q}",
                        node_local_dir="{resources.node_local_dir:q}", training=True)


rule teacher_finetune:
    input:
        data=rules.prepare_data.output[0],
        tokenizer=rules.tokenizer.output[0],
        pretrained=[f"{ROOT}/teacher_pretrain"] if TEACHER_FROM_SCRATCH else [],
        code=code("teacher-finetune"),
    output:
        directory(f"{ROOT}/teacher"),
    params:
        cfg=training_config("seed", "teacher", "squad"),
        pretrained=lambda wildcards, input: input.pretrained[0] if input.pretrained else "",  # '': a hub teacher
        work=f"{ROOT}/work/teacher_finetune",
    log:
        log_file("teacher_finetune"),
    benchmark:
        benchmark_file("teacher_finetune")
    # First among the jobs that become ready with it: it is the longest on the way to distill_squad, and where it
    # takes every core, a 1-thread job started first would keep it waiting beside an idle core.
    priority: CRITICAL + 1
    threads: training_threads(CFG.teacher.finetune, workflow.cores)
    resources:
        **TRAIN_RESOURCES,
    shell:
        stage_shell("teacher-finetune", data_dir="{input.data:q}", tokenizer_dir="{input.tokenizer:q}",
                    pretrained_dir="{params.pretrained:q}", out_dir="{output:q}", work_dir="{params.work:q}",
                    training=True)
