"""Evaluation: running mteb tasks on a model and writing their results (:mod:`.results`), tasks scored at once
(:mod:`.concurrency`) and in processes of their own (:mod:`.task_processes`) or Ray actors (:mod:`.ray_tasks`),
task data loaded ahead (:mod:`.prefetch`), and retrieve-then-rerank (:mod:`.two_stage`)."""
