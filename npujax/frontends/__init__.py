"""Model frontends: Flax tracing (:mod:`.flax`) and ONNX import (:mod:`.onnx`)."""
