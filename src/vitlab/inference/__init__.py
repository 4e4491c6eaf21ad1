"""Using a trained model: `evaluate` (top-1 / top-5 on a data set, optionally through a speed mode, with TTA) and
`predict` (`vitlab.predict(model_or_checkpoint, images)`: the top classes of image files)."""
