# Target `study` (not in `all`): the distillation evidence. distill_squad and its alternatives over several seeds,
# from the same distilled student and teacher, and the summary with intervals; and the random-init ablation of
# distill_pretrain (same budget, random student). Run: snakemake --cores 2 study


rule study:
    input:
        f"{ROOT}/study/summary.json",
        # the random-init ablation of distill_pretrain, unless the student is pretrained elsewhere (student.pretrained)
        expand(f"{ROOT}/distill_pretrain/{{variant}}", variant=STUDENT_VARIANTS if STUDENT_DISTILLED_HERE else []),


rule study_run:
    input:
        student=SQUAD_STUDENT_INPUT,
        teacher=rules.teacher_finetune.output[0],
        mlm_teacher=[MLM_TEACHER] if AUGMENT and TEACHER_FROM_SCRATCH else [],
        data=rules.prepare_data.output[0],
        code=code("distill-squad"),  # the run's objectives (pipeline/plan/study_runs.py) reach it as params.cfg
    output:
        directory(f"{ROOT}/study/{{run}}/seed{{seed}}"),
    wildcard_constraints:
        run="|".join(STUDY_RUNS),
        seed=r"\d+",
    params:
        cfg=study_run_config,
        student=SQUAD_STUDENT,
        # the CE-only baseline has no teacher
        ce_only=lambda wildcards: "true" if wildcards.run == study_runs.BASELINE else "false",
        teacher=lambda wildcards, input: "" if wildcards.run == study_runs.BASELINE else str(input.teacher),
        mlm_teacher=lambda wildcards: "" if wildcards.run == study_runs.BASELINE else MLM_TEACHER_FOR_AUGMENTATION,
        work=lambda wildcards: f"{ROOT}/work/study/{wildcards.run}/seed{wildcards.seed}",
    log:
        log_file("study/{run}_seed{seed}"),
    benchmark:
        benchmark_file("study/{run}_seed{seed}")
    threads: training_threads(CFG.distill_squad.train, PAIRED_THREADS)
    resources:
        **TRAIN_RESOURCES,
    shell:
        stage_shell("distill-squad", ce_only="{params.ce_only}", teacher_dir="{params.teacher:q}",
                    mlm_teacher_dir="{params.mlm_teacher:q}", student_dir="{params.student:q}",
                    data_dir="{input.data:q}", out_dir="{output:q}", work_dir="{params.work:q}", training=True)


rule study_summary:
    input:
        runs=expand(f"{ROOT}/study/{{run}}/seed{{seed}}", run=STUDY_RUNS, seed=CFG.study.seeds),
        teacher=rules.teacher_finetune.output[0],
        data=rules.prepare_data.output[0],
        code=code("study-summary"),
    output:
        summary=f"{ROOT}/study/summary.json",
        markdown=f"{ROOT}/study/summary.md",
    params:
        cfg=stage_config("study"),
        runs_dir=f"{ROOT}/study",
    log:
        log_file("study_summary"),
    threads: 1
    resources:
        **LIGHT_RESOURCES,
    shell:
        stage_shell("study-summary", runs_dir="{params.runs_dir:q}", data_dir="{input.data:q}",
                    teacher_dir="{input.teacher:q}", out_dir="{params.runs_dir:q}")
