"""Everything that trains: one loop over tasks, one checkpoint and resume path, interrupts, DDP.

``train(config, out=...)`` (``sc.train``, ``structconv train``) builds a config's task, model
and optimizer and runs ``loop.Loop`` over them; ``tasks`` holds one file per task (node, sampled
node, image, text, link, seq2seq); ``checkpoint`` writes and checks safetensors checkpoints;
``interrupt`` stops at a batch boundary on a signal; ``distributed`` runs DDP processes;
``runlog`` writes metrics, curves and progress; ``optim`` builds optimizers, parameter groups
and learning-rate schedules; ``minibatch`` trains node models on sampled neighbourhoods.
"""

from .checkpoint import CheckpointError
from .common import (
    TrainingError,
    count_parameters,
    default_run_dir,
    prepare_run,
    resolve_device,
    resume_command,
)
from .interrupt import StopRequest, TrainingInterrupted
from .loop import Loop, check_trainer_state
from .optim import param_groups
from .run import check_world_size, load_run, make_optimizer, train
from .runlog import plot_curves
from .tasks import (
    Task,
    check_train_split,
    decode_result,
    evaluate,
    evaluate_link,
    load_data,
    task_for,
    train_link,
)

__all__ = ["TrainingError", "CheckpointError", "train", "evaluate", "evaluate_link",
           "decode_result", "load_data", "resolve_device", "load_run", "make_optimizer",
           "count_parameters", "prepare_run", "check_world_size", "check_train_split",
           "resume_command", "default_run_dir", "train_link", "Loop", "Task", "task_for",
           "param_groups", "check_trainer_state", "StopRequest", "TrainingInterrupted",
           "plot_curves"]
