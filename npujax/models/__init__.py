"""Reference Flax models (:mod:`.cnn`, the transformers of :mod:`.transformer`) and the zoo
of real ONNX models (:mod:`.zoo`)."""
