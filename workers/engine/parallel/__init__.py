"""The four parallel dimensions of the engine: tensor (+sequence), context, pipeline, data."""
