"""Datasets and input pipelines: Fashion-MNIST / MNIST (IDX), CIFAR-10/100 (binary), ImageFolder trees,
WebDataset shards; deterministic, resumable, rank-splittable training streams."""

from .batch_augment import resized_crop_batch, sample_crop_boxes
from .build import build_eval_data, build_train_stream, first_images
from .config import DataConfig, parse_data_spec
from .errors import DataError
from .images import (
                     BadImageError,
                     BadImageWarning,
                     image_batches,
                     load_images,
                     preprocess_of,
                     preprocess_transform,
                     transforms_for,
)
from .labels import class_names, imagenet_classes
from .stream import EvalData, TrainStream

__all__ = [
    "BadImageError",
    "BadImageWarning",
    "DataConfig",
    "DataError",
    "EvalData",
    "TrainStream",
    "build_eval_data",
    "build_train_stream",
    "class_names",
    "first_images",
    "image_batches",
    "imagenet_classes",
    "load_images",
    "parse_data_spec",
    "preprocess_of",
    "preprocess_transform",
    "resized_crop_batch",
    "sample_crop_boxes",
    "transforms_for",
]
