"""Model frontends: Flax tracing (:mod:`.flax`), Keras 3 tracing (:mod:`.keras`, the ``keras``
extra) and ONNX import (:mod:`.onnx`)."""
