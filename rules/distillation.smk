# Distillation: the student initialised from every other teacher layer, distilled during MLM pretraining (triple
# loss), then on SQuAD (distill_squad), beside the CE-only baseline from the same student (student_finetune).


rule init_student:
    input:
        teacher=[MLM_TEACHER] if TEACHER_FROM_SCRATCH else [],
        tokenizer=rules.tokenizer.output[0],
        code=code("init-student"),
    output:
        directory(f"{ROOT}/student_init/{{variant}}"),
    wildcard_constraints:
        variant="main|random_init_ablation",
    params:
        cfg=stage_config("seed", "student"),
        teacher=MLM_TEACHER,
        init=lambda wildcards: "random" if wildcards.variant == "random_init_ablation" else CFG.student.init,
    log:
        log_file("init_student_{variant}"),
    benchmark:
        benchmark_file("init_student_{variant}")
    # the main student is on the critical path; the random-init ablation waits for idle cores
    priority: lambda wildcards: CRITICAL if wildcards.variant == "main" else 1
    threads: 1
    resources:
        **LIGHT_RESOURCES,
    shell:
        stage_shell("init-student", teacher="{params.teacher:q}", tokenizer_dir="{input.tokenizer:q}",
                    init="{params.init:q}", out_dir="{output:q}")


rule distill_pretrain:
    input:
        student=f"{ROOT}/student_init/{{variant}}",
        teacher=[MLM_TEACHER] if TEACHER_FROM_SCRATCH else [],
        corpus=rules.tokenize_corpus.output[0],
        code=code("distill-pretrain"),
    output:
        directory(f"{ROOT}/distill_pretrain/{{variant}}"),
    wildcard_constraints:
        variant="main|random_init_ablation",
    params:
        cfg=training_config("seed", "distill_pretrain"),
        teacher=MLM_TEACHER,
        work=lambda wildcards: f"{ROOT}/work/distill_pretrain_{wildcards.variant}",
    log:
        log_file("distill_pretrain_{variant}"),
    benchmark:
        benchmark_file("distill_pretrain_{variant}")
    priority: lambda wildcards: CRITICAL if wildcards.variant == "main" else 1
    threads: training_threads(CFG.distill_pretrain.train, PAIRED_THREADS)
    resources:
        **TRAIN_RESOURCES,
    shell:
        stage_shell("distill-pretrain", student_dir="{input.student:q}", teacher="{params.teacher:q}",
                    corpus_dir="{input.corpus:q}", out_dir="{output:q}", work_dir="{params.work:q}",
                    node_local_dir="{resources.node_local_dir:q}", training=True)


rule distill_squad:
    input:
        student=SQUAD_STUDENT_INPUT,
        teacher=rules.teacher_finetune.output[0],
        mlm_teacher=[MLM_TEACHER] if AUGMENT and TEACHER_FROM_SCRATCH else [],
        data=rules.prepare_data.output[0],
        code=code("distill-squad"),
    output:
        directory(f"{ROOT}/distill_squad"),
    params:
        cfg=training_config("seed", "squad", "distill_squad"),
        student=SQUAD_STUDENT,
        mlm_teacher=MLM_TEACHER_FOR_AUGMENTATION,
        work=f"{ROOT}/work/distill_squad",
    log:
        log_file("distill_squad"),
    benchmark:
        benchmark_file("distill_squad")
    priority: CRITICAL
    threads: training_threads(CFG.distill_squad.train, PAIRED_THREADS)
    resources:
        **TRAIN_RESOURCES,
    shell:
        stage_shell("distill-squad", student_dir="{params.student:q}", teacher_dir="{input.teacher:q}",
                    mlm_teacher_dir="{params.mlm_teacher:q}", data_dir="{input.data:q}", out_dir="{output:q}",
                    work_dir="{params.work:q}", training=True)


rule student_finetune:
    input:
        student=SQUAD_STUDENT_INPUT,
        data=rules.prepare_data.output[0],
        code=code("distill-squad"),
    output:
        directory(f"{ROOT}/student_finetune"),
    params:
        cfg=training_config("seed", "squad", "distill_squad"),
        student=SQUAD_STUDENT,
        work=f"{ROOT}/work/student_finetune",
    log:
        log_file("student_finetune"),
    benchmark:
        benchmark_file("student_finetune")
    priority: BASELINE  # the CE-only baseline: off the critical path, ahead of the exports
    threads: training_threads(CFG.distill_squad.train, PAIRED_THREADS)
    resources:
        **TRAIN_RESOURCES,
    shell:
        stage_shell("distill-squad", ce_only=True, student_dir="{params.student:q}", data_dir="{input.data:q}",
                    out_dir="{output:q}", work_dir="{params.work:q}", training=True)
