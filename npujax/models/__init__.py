"""Reference Flax models (:mod:`.cnn`) and the zoo of real ONNX models (:mod:`.zoo`)."""
