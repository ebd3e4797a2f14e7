"""Build a Graph from a Keras 3 model on the JAX backend, by tracing it as Flax models are.

A Keras 3 model on the JAX backend is a JAX function: :func:`trace_keras` traces it with the
Flax tracer's core (:mod:`npujax.frontends.flax`), the model never rewritten. For the trace, the
``call`` of the parameterised layers is patched (and restored after) so that each call of

===========================  =====================  ==============================================
Keras layer                  Graph node             params
===========================  =====================  ==============================================
``Conv2D``                   ``Conv``               ``kernel`` (HWIO), ``bias``
``DepthwiseConv2D``          ``Conv`` (groups = C)  ``kernel`` ``(kh, kw, 1, C * multiplier)``
``Dense``                    ``Gemm``               ``kernel`` ``(in, units)``, ``bias``
``BatchNormalization``       ``BatchNormalization`` ``scale``, ``bias``, ``mean``, ``var``
``LayerNormalization``       ``LayerNormalization`` ``scale``, ``bias`` (last axis, no RMS scaling)
``SeparableConv2D``          ``Conv``, ``Conv``     ``<layer>/depthwise``: ``kernel``;
                                                    ``<layer>``: ``kernel``, ``bias``
===========================  =====================  ==============================================

runs its linear part inside a marker scope and becomes one node named after the Keras layer;
the layer's ``activation`` runs after it, outside the marker (it becomes its own node, which
:func:`npujax.optimize` fuses back as the layer's epilogue). A BatchNormalization without
``scale``/``center`` gets ones/zeros, so every BN node has the four roles. Every other layer
(``ReLU``, ``Add``, ``Concatenate``, pools, ``ZeroPadding2D``, ``Flatten``, ...) is traced
primitive by primitive, and its nodes are named after the Keras layer that made them (the
innermost :func:`jax.named_scope`, which Keras opens for every layer call): ``Conv1_relu``,
``block_2_add``; a second node of one layer is ``<layer>/<op>`` (a Dense layer's softmax is
``predictions/softmax``). A few jax.numpy patterns become the operator an NPU compiler sees:
``ReLU(6.0)`` a ``Relu6`` node, a global average pool an ``AveragePool`` over the whole image, an
average pool with ``padding="same"`` an ``AveragePool`` that does not count the padding. The
graph is checked against the model's own output on the example input, so a tracing mistake
never passes silently.

The Keras applications (``keras.applications.MobileNetV2``, ``ResNet50``, ...) are reached by a
model spec, ``keras:NAME[:key=value...]`` (:func:`keras_application`), which every command that
takes a model path accepts; they are built with ``weights=None`` (seeded random weights, no
network).

Keras is an optional dependency (``pip install "npujax[keras]"``) and must run on the JAX
backend: if it is not imported yet, ``KERAS_BACKEND`` defaults to ``jax`` when npujax imports
it.
"""

from __future__ import annotations

import collections
import contextlib
import difflib
import inspect
import os
import random
import sys
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from npujax import _program_cache
from npujax.errors import ConfigError, GraphError
from npujax.frontends.flax import _MARK, _RUN_ONCE, _intercept_functions, _Leaf, _trace_jaxpr
from npujax.ir.graph import Graph, Params

__all__ = ["trace_keras", "keras_application", "is_keras_spec", "KERAS_PREFIX"]

#: The prefix of a Keras application model spec: ``keras:MobileNetV2``.
KERAS_PREFIX = "keras:"
#: Seed of the random weights of :func:`keras_application` (``keras.utils.set_random_seed``).
SEED = 0


def _keras() -> Any:
    """The ``keras`` module, on the JAX backend.

    Raises:
      ConfigError: Keras is not installed, is not Keras 3, or runs on another backend.
    """
    if "keras" not in sys.modules:
        os.environ.setdefault("KERAS_BACKEND", "jax")
    try:
        import keras
    except ModuleNotFoundError as e:
        if e.name == "keras":
            raise ConfigError('Keras models need Keras 3: pip install "npujax[keras]" (or pip '
                              'install "keras>=3.6").') from None
        raise ConfigError(f"Keras could not be imported ({e}); npujax traces Keras models on "
                          "the JAX backend: set KERAS_BACKEND=jax before importing keras."
                          ) from None
    version = getattr(keras, "__version__", "0")
    if not version.split(".")[0].isdigit() or int(version.split(".")[0]) < 3:
        raise ConfigError(f"Keras {version} is installed; npujax traces Keras 3 models on the "
                          'JAX backend: pip install "npujax[keras]" (keras>=3.6).')
    backend = keras.backend.backend()
    if backend != "jax":
        raise ConfigError(f"Keras runs on the {backend!r} backend; npujax traces Keras models "
                          "as JAX functions: set KERAS_BACKEND=jax before Keras is imported "
                          "(first thing in the program, or in the environment).")
    return keras


# --------------------------------------------------------------------------------------------
# Interception: each known layer's linear part in a marker scope, its activation after it.


def _array(v: Any) -> np.ndarray:
    return np.asarray(jax.device_get(getattr(v, "value", v)), np.float32)


def _depthwise(kernel: np.ndarray) -> np.ndarray:
    """A Keras depthwise kernel ``(kh, kw, C, multiplier)`` as the convolution uses it: HWIO
    ``(kh, kw, 1, C * multiplier)`` with groups = C."""
    return kernel.reshape(*kernel.shape[:-2], 1, kernel.shape[-2] * kernel.shape[-1])


def _leaf_params(op: str, layer: Any, rank: int
                 ) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """``(params, attrs)`` of an intercepted layer called on an input of ``rank``, or None to
    trace it primitive by primitive (a quantized or LoRA layer, options its node lacks)."""
    if getattr(layer, "quantization_mode", None) is not None or getattr(
            layer, "lora_enabled", False):
        return None
    bias = getattr(layer, "bias", None)
    if op == "LayerNormalization":
        axes = [layer.axis] if isinstance(layer.axis, int) else list(layer.axis)
        if [a % rank for a in axes] != [rank - 1] or layer.rms_scaling:
            return None
        norm = {"scale": _array(layer.gamma) if layer.scale else None,
                "bias": _array(layer.beta) if layer.center else None}
        return ({k: v for k, v in norm.items() if v is not None},
                {"epsilon": float(layer.epsilon), "axis": -1})
    if op == "BatchNormalization":
        axis = layer.axis if isinstance(layer.axis, int) else (
            layer.axis[0] if len(layer.axis) == 1 else None)
        if axis is None or getattr(layer, "renorm", False):
            return None
        mean = _array(layer.moving_mean)
        return ({"scale": _array(layer.gamma) if layer.scale else np.ones_like(mean),
                 "bias": _array(layer.beta) if layer.center else np.zeros_like(mean),
                 "mean": mean, "var": _array(layer.moving_variance)},
                {"epsilon": float(layer.epsilon), "axis": int(axis)})
    if op == "SeparableConv":  # the pointwise convolution; the depthwise one is its own leaf
        kernel = _array(layer.pointwise_kernel)
    else:
        kernel = _array(layer.kernel)
    params = {"kernel": _depthwise(kernel) if op == "DepthwiseConv" else kernel}
    if bias is not None:
        params["bias"] = _array(bias)
    return params, {}


def _layer_classes(keras: Any) -> dict[Any, str]:
    """The intercepted Keras layer classes and their leaf kinds."""
    L = keras.layers
    return {L.Conv2D: "Conv", L.DepthwiseConv2D: "DepthwiseConv", L.Dense: "Gemm",
            L.BatchNormalization: "BatchNormalization",
            L.LayerNormalization: "LayerNormalization", L.SeparableConv2D: "SeparableConv"}


@contextlib.contextmanager
def _intercept_layers(keras: Any, leaves: list[_Leaf]) -> Iterator[None]:
    """Patch the ``call`` of the intercepted layer classes for the trace (each class's own
    attribute restored after, or removed where it only inherited ``call``)."""
    saved: dict[Any, Callable | None] = {}  # each patched class's own call (None: inherited)

    def marked(leaf: _Leaf) -> Any:
        leaves.append(leaf)
        return jax.named_scope(f"{_MARK}{len(leaves) - 1}")

    def make(kind: str, orig: Callable) -> Callable:
        op = kind if kind in ("Gemm", "BatchNormalization", "LayerNormalization") else "Conv"

        def call(self, inputs, *args, **kwargs):
            got = _leaf_params(kind, self, len(inputs.shape))
            if got is None:
                return orig(self, inputs, *args, **kwargs)
            params, attrs = got
            if kind == "SeparableConv":  # Keras' one call, as two convolutions
                return _separable(keras, self, inputs, params, marked)
            activation = self.__dict__.get("activation")
            if activation is not None:  # run after the marked linear part, as its own node
                object.__setattr__(self, "activation", None)
            try:
                with marked(_Leaf(op, self.name, self, params, attrs)):
                    y = orig(self, inputs, *args, **kwargs)
            finally:
                if activation is not None:
                    object.__setattr__(self, "activation", activation)
            return y if activation is None else activation(y)

        return call

    try:
        for cls, kind in _layer_classes(keras).items():
            saved[cls] = cls.__dict__.get("call")
            # deliberate interception: the layer classes' call is patched for the trace
            cls.call = make(kind, cls.call)
        yield
    finally:
        for cls, own in saved.items():
            if own is None:
                del cls.call
            else:
                cls.call = own  # (restored)


def _separable(keras: Any, layer: Any, x: Any, params: dict[str, np.ndarray],
               marked: Callable[[_Leaf], Any]) -> Any:
    """``SeparableConv2D.call`` (``ops.separable_conv``, the bias, the activation) with its
    depthwise and pointwise convolutions as two leaves, ``<layer>/depthwise`` and ``<layer>``."""
    ops = keras.ops
    depthwise = _depthwise(_array(layer.depthwise_kernel))
    with marked(_Leaf("Conv", f"{layer.name}/depthwise", layer, {"kernel": depthwise}, {})):
        x = ops.depthwise_conv(x, layer.depthwise_kernel, strides=layer.strides,
                               padding=layer.padding, data_format=layer.data_format,
                               dilation_rate=layer.dilation_rate)
    with marked(_Leaf("Conv", layer.name, layer, params, {})):
        x = ops.conv(x, layer.pointwise_kernel, strides=1, padding="valid",
                     data_format=layer.data_format, dilation_rate=layer.dilation_rate)
        if layer.use_bias:
            channel = -1 if layer.data_format == "channels_last" else 1
            shape = [1] * len(x.shape)
            shape[channel] = layer.filters
            x = ops.add(x, ops.reshape(layer.bias, shape))
    return x if layer.activation is None else layer.activation(x)


# --------------------------------------------------------------------------------------------
# Model specs: keras:NAME[:key=value...]


def is_keras_spec(model: Any) -> bool:
    """Whether ``model`` is a Keras application spec (a string ``keras:NAME[:key=value...]``)."""
    return isinstance(model, str) and model.startswith(KERAS_PREFIX)


def _applications(keras: Any) -> dict[str, Callable]:
    apps = keras.applications
    return {n: getattr(apps, n) for n in dir(apps)
            if n[:1].isupper() and callable(getattr(apps, n))}


def _close(word: str, names: list[str]) -> str:
    """``did you mean A or B? `` (names that extend ``word`` first, e.g. ``MobileNetV3`` ->
    ``MobileNetV3Large``, then the closest spellings), or ``""``."""
    longer = sorted(n for n in names if n.lower().startswith(word.lower()) and n != word)
    near = longer + [n for n in difflib.get_close_matches(word, names, n=3, cutoff=0.5)
                     if n not in longer]
    return f"did you mean {' or '.join(near[:3])}? " if near else ""


def _value(key: str, text: str) -> Any:
    """An option's value: ``input_shape`` as ``224x224x3``; else int, float, bool, None or the
    string itself."""
    if key == "input_shape":
        try:
            shape = tuple(int(d) for d in text.lower().split("x"))
        except ValueError:
            shape = ()
        if len(shape) != 3 or any(d <= 0 for d in shape):  # the applications take images
            raise ConfigError(f"keras option input_shape={text!r} is not HxWxC (positive "
                              "integers, channels last as in Keras), e.g. input_shape=224x224x3.")
        return shape
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def keras_application(spec: str) -> Any:
    """The Keras application a model spec names, built with seeded random weights.

    Args:
      spec: ``keras:NAME[:key=value...]`` (the ``keras:`` prefix optional): ``NAME`` a
        constructor of ``keras.applications`` (``MobileNetV2``, ``ResNet50``, ...), the options
        its keyword arguments, e.g. ``keras:MobileNet:alpha=0.25:input_shape=128x128x3``
        (``input_shape`` as ``HxWxC``, channels last; default the application's own, 224x224x3
        for most, 299x299x3 for the Inception models). Values are read as int, float,
        ``true``/``false``, ``none`` or a string.

    Returns:
      The ``keras.Model``, built with ``weights=None`` after ``keras.utils.set_random_seed(0)``
      (the same weights on every call; Python's and NumPy's global random states are restored
      after).

    Raises:
      ConfigError: Keras missing or not on the JAX backend, an unknown application or option
        (the message lists the close names), a ``weights`` option, or options Keras refuses.

    Example:
      >>> model = keras_application("keras:MobileNet:alpha=0.25:input_shape=32x32x3")
      ...  # doctest: +SKIP
    """
    keras = _keras()
    body = spec[len(KERAS_PREFIX):] if spec.startswith(KERAS_PREFIX) else spec
    name, *options = body.split(":")
    apps = _applications(keras)
    if name not in apps:
        raise ConfigError(f"keras.applications has no model {name!r}; {_close(name, list(apps))}"
                          f"known: {', '.join(sorted(apps))} (write keras:MobileNetV2).")
    build = apps[name]
    accepted = [p for p in inspect.signature(build).parameters if p not in ("weights",
                                                                            "input_tensor")]
    kwargs: dict[str, Any] = {}
    for option in options:
        key, sep, text = option.partition("=")
        key = key.strip()
        if key == "weights":
            raise ConfigError(f"{spec}: keras: models are built with random weights (weights="
                              "None; npujax fetches none); drop the weights option.")
        if not sep or key not in accepted:
            what = f"option {option!r} is not key=value" if not sep else f"no option {key!r}"
            raise ConfigError(f"{spec}: keras.applications.{name} has {what}; "
                              f"{_close(key, accepted)}options: {', '.join(accepted)}.")
        if key in kwargs:
            raise ConfigError(f"{spec}: option {key!r} is given twice.")
        kwargs[key] = _value(key, text.strip())
    states = random.getstate(), np.random.get_state()
    try:
        # the weights' random initialisers compile one small program per shape (0.2 s each,
        # 5 s for MobileNet): kept in the command line's compile cache however fast they
        # compiled, so a later run loads them (the same programs: the same weights)
        with _fresh_layer_names(), _program_cache.cache_every_compilation():
            keras.utils.set_random_seed(SEED)
            return build(weights=None, **kwargs)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{spec}: Keras refuses these options: {e}".rstrip()) from None
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])


@contextlib.contextmanager
def _fresh_layer_names() -> Iterator[None]:
    """Keras' counters of automatic layer names (``average_pooling2d_3``) started afresh, and
    restored after: a spec's layers (so its nodes) have the same names in every process, not
    names that depend on the models built before. (Keras' private global state; without it,
    the names are Keras' usual ones.)"""
    try:
        from keras.src.backend.common import global_state
    except ImportError:
        yield
        return
    saved = global_state.get_global_attribute("object_name_uids")
    global_state.set_global_attribute("object_name_uids", collections.defaultdict(int))
    try:
        yield
    finally:
        global_state.set_global_attribute("object_name_uids", saved)


# --------------------------------------------------------------------------------------------
# Tracing


def _example(model: Any, example_input: ArrayLike | None,
             input_shape: tuple[int, ...] | None) -> jax.Array:
    """The example input: given, or standard-normal noise (seed 0) of batch 1 and the model's
    (or ``input_shape``'s) shape."""
    if example_input is not None:
        x = jnp.asarray(example_input)
        return x if jnp.issubdtype(x.dtype, jnp.integer) else x.astype(jnp.float32)
    if input_shape is None:
        shape = getattr(model, "input_shape", None) if getattr(model, "built", False) else None
        if isinstance(shape, list):
            raise GraphError(f"Keras model {model.name!r} has {len(shape)} inputs; npujax traces "
                             "models of one input.")
        if shape is None or any(d is None for d in shape[1:]):
            raise ConfigError(f"the input shape of Keras model {model.name!r} is not fixed "
                              f"({shape}); pass example_input= or input_shape=(H, W, C).")
        input_shape = tuple(int(d) for d in shape[1:])
    return jnp.asarray(np.random.default_rng(0).standard_normal((1, *input_shape)), jnp.float32)


def trace_keras(
    model: Any,
    example_input: ArrayLike | None = None,
    *,
    input_shape: tuple[int, ...] | None = None,
    check: bool = True,
) -> tuple[Graph, Params]:
    """Trace a Keras 3 model (JAX backend) into a :class:`Graph` and its params pytree.

    Args:
      model: a ``keras.Model`` (or a layer), called with ``training=False``; or a model spec
        ``keras:NAME[:key=value...]`` (:func:`keras_application`; an application that takes
        any image size, as MobileNetV3 does, is traced at 224x224 unless the spec sets
        ``input_shape``).
      example_input: array ``(batch, ...)``, float (converted to float32) or integer (token
        ids, kept); it fixes the graph's shapes. Default: batch 1 of the model's input shape,
        standard-normal noise.
      input_shape: the input's shape without the batch (``(224, 224, 3)``) when
        ``example_input`` is not given and the model's is not fixed.
      check: run the graph on the example input and compare with the model (recommended).

    Returns:
      ``(graph, params)``: nodes named after the Keras layers (``Conv1``, ``bn_Conv1``,
      ``Conv1_relu``; see the module docstring); the input tensor ``input``, the output
      ``output``; params ``{node: {role: float32 array}}``; ``graph.source == "keras"``.

    Raises:
      ConfigError: Keras missing or not on the JAX backend; an unknown spec; no input shape.
      GraphError: ``model`` is not a Keras model or has several inputs; the traced graph does
        not reproduce the model's output.
      UnsupportedOpError: a primitive or layer option has no Graph operator (names it).

    Example:
      >>> graph, params = trace_keras("keras:MobileNetV2")  # doctest: +SKIP
      >>> graph, params = trace_keras(my_model, x[:1])  # doctest: +SKIP
    """
    keras = _keras()
    if isinstance(model, str):
        if not is_keras_spec(model):
            raise ConfigError(f"{model!r} is not a Keras model spec; write keras:NAME, e.g. "
                              "keras:MobileNetV2.")
        model = keras_application(model)
        shape = model.input_shape
        if (example_input is None and input_shape is None and len(shape) == 4
                and shape[1] is None and shape[2] is None and shape[3] is not None):
            input_shape = (224, 224, int(shape[3]))  # an application of any size (MobileNetV3)
    if not isinstance(model, keras.layers.Layer):
        raise GraphError(f"trace_keras needs a Keras 3 model (keras.Model or keras.layers.Layer) "
                         f"or a keras:NAME spec; got {type(model).__module__}."
                         f"{type(model).__name__}. For Flax models use npujax.trace_flax.")
    x = _example(model, example_input, input_shape)
    leaves: list[_Leaf] = []

    def fn(inp: jax.Array) -> Any:
        with _intercept_layers(keras, leaves), _intercept_functions(leaves):
            return _one_output(model(inp, training=False))

    trainable = [v.value for v in model.trainable_variables]
    frozen = [v.value for v in model.non_trainable_variables]
    # jitted with the weights as arguments: one compiled program, no weights baked into it
    run = jax.jit(lambda tv, ntv, inp: _one_output(
        model.stateless_call(tv, ntv, inp, training=False)[0]), compiler_options=_RUN_ONCE)
    graph, params = _trace_jaxpr(fn, x, leaves, reference=lambda inp: run(trainable, frozen, inp),
                                 source="keras", input_name="input", check=check,
                                 scope_names=True, peepholes=True)
    return graph, params


def _one_output(y: Any) -> Any:
    if isinstance(y, (list, tuple, dict)):
        raise GraphError(f"the Keras model returns {len(y)} outputs; npujax traces models of "
                         "one output.")
    return y
