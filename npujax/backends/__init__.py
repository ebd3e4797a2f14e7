"""Backends: integer-only execution (:mod:`.integer`) and QDQ ONNX export (:mod:`.onnx_export`)."""
