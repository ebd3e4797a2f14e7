"""Histogram observers (percentile, MSE, entropy) and the invariants every observer keeps."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from npujax.calib import (
    OBSERVERS,
    check_finite_state,
    entropy_observer,
    get_observer,
    mse_observer,
    percentile_observer,
)
from npujax.errors import CalibrationError
from npujax.numerics import MIN_SCALE, IntFormat, fake_quant, qparams_from_range

U8, I8 = IntFormat(8, signed=False), IntFormat(8)


def small(name, axis=None):
    """The observer with a small histogram (fast tests; the invariants do not depend on it)."""
    return get_observer(name, axis=axis, **({"bins": 256} if name in
                                            ("percentile", "mse", "entropy") else {}))


def run(obs, batches):
    state = obs.init(batches[0])
    upd = jax.jit(obs.update)  # one compile per observer and batch shape
    for b in batches:
        state = upd(state, jnp.asarray(b, jnp.float32))
    return state


def test_histogram_keeps_mass_when_range_grows():
    obs = percentile_observer(bins=64)
    rng = np.random.default_rng(0)
    batches = [rng.normal(size=500) * s for s in (0.1, 1.0, 5.0)]
    state = run(obs, batches)
    np.testing.assert_allclose(float(jnp.sum(state["hist"])), 1500.0, rtol=1e-5)
    assert float(state["amax"]) == pytest.approx(max(np.abs(b).max() for b in batches))


def test_percentile_matches_numpy_quantile():
    rng = np.random.default_rng(1)
    x = rng.normal(size=100_000).astype(np.float32)
    lo, hi = percentile_observer(99.0).compute_range(run(percentile_observer(99.0), [x]), U8)
    q_lo, q_hi = np.quantile(x, [0.01, 0.99])
    width = 2 * np.abs(x).max() / 4096
    assert abs(float(lo) - q_lo) < 2 * width and abs(float(hi) - q_hi) < 2 * width


def test_mse_clips_a_heavy_tail_at_4_bits():
    # Laplace data with a few far outliers: the MSE-optimal 4-bit clip lies well inside max|x|,
    # and its expected error is lower than min-max's.
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.laplace(size=50_000), [40.0, -40.0]]).astype(np.float32)
    fmt = IntFormat(4)
    obs = mse_observer(bins=512)
    lo, hi = obs.compute_range(run(obs, [x]), fmt, True)
    assert 1.0 < float(hi) < 20.0

    def mse(lo, hi):
        s, z = qparams_from_range(jnp.float32(lo), jnp.float32(hi), fmt, True)
        return float(jnp.mean((fake_quant(jnp.asarray(x), s, z, fmt) - x) ** 2))

    assert mse(lo, hi) < 0.5 * mse(x.min(), x.max())


def test_entropy_threshold_inside_range_for_gaussian():
    rng = np.random.default_rng(3)
    x = rng.normal(size=200_000).astype(np.float32)
    obs = entropy_observer()
    lo, hi = obs.compute_range(run(obs, [x]), I8, True)
    # TensorRT-style KL calibration of N(0, 1) at int8 clips at a few sigma, below max|x| (~4.5)
    assert 2.0 < float(hi) < float(np.abs(x).max())
    assert float(lo) == pytest.approx(-float(hi), rel=1e-6)


@pytest.mark.parametrize("name", OBSERVERS)
def test_invariants_every_observer(name):
    fmt = U8
    obs = small(name)
    # all-zero tensor -> finite positive scale, exact zeros
    z = jnp.zeros((64, 8), jnp.float32)
    lo, hi = obs.compute_range(run(obs, [z]), fmt, False)
    s, zp = qparams_from_range(lo, hi, fmt, False)
    assert np.isfinite(float(s)) and float(s) >= MIN_SCALE
    assert np.all(np.asarray(fake_quant(z, s, zp, fmt)) == 0.0)
    # one-signed (positive) data -> zero point at qmin; negative -> at qmax
    x = jnp.asarray(np.random.default_rng(4).uniform(0.5, 3.0, (64, 8)), jnp.float32)
    for data, want in ((x, fmt.qmin), (-x, fmt.qmax)):
        lo, hi = obs.compute_range(run(obs, [data]), fmt, False)
        _, zp = qparams_from_range(lo, hi, fmt, False)
        assert int(zp) == want
    # NaN / inf -> CalibrationError naming the layer
    for bad in (np.nan, np.inf):
        y = x.at[3, 5].set(bad)
        with pytest.raises(CalibrationError, match="fc3"):
            check_finite_state(run(obs, [y]), "fc3")


@pytest.mark.parametrize("name", ["minmax", "percentile", "mse", "entropy"])
def test_dead_channel_per_channel(name):
    obs = small(name, axis=1)
    x = np.random.default_rng(5).normal(size=(128, 3)).astype(np.float32)
    x[:, 1] = 0.0  # a dead channel
    lo, hi = obs.compute_range(run(obs, [x]), I8, True)
    assert lo.shape == (3,)
    s, zp = qparams_from_range(lo, hi, I8, True)
    assert np.all(np.isfinite(np.asarray(s))) and np.all(np.asarray(s) > 0)
    out = fake_quant(jnp.asarray(x), s, zp, I8, axis=1)
    assert np.all(np.asarray(out)[:, 1] == 0.0)


def test_unknown_observer_and_bad_args():
    with pytest.raises(CalibrationError, match="entropy"):
        get_observer("kl")
    with pytest.raises(CalibrationError):
        percentile_observer(40.0)


@pytest.mark.parametrize("name", ["entropy", "mse"])
def test_sparse_relu_data_is_not_clipped_to_the_zero_spike(name):
    # 90 % exact zeros (post-ReLU sparsity) must not pull the threshold towards 0: zeros are
    # exact on every grid, so the criteria ignore them.
    rng = np.random.default_rng(6)
    dense = np.abs(rng.normal(size=50_000)).astype(np.float32)
    sparse = dense.copy()
    sparse[rng.uniform(size=sparse.size) < 0.9] = 0.0
    his = []
    for x in (dense, sparse):
        obs = small(name)
        his.append(float(obs.compute_range(run(obs, [x]), U8, False)[1]))
    assert his[1] > 0.7 * his[0], his


def _pixels(rng, n=20_000):
    """Digits-like image input: intensities k/16 (k = 0..16), about half exact zeros."""
    p = np.r_[0.49, np.full(15, 0.025), 0.135]
    return (rng.choice(17, size=n, p=p / p.sum()) / 16.0).astype(np.float32)


def _relu_with_outliers(rng, n=20_000):
    x = np.maximum(rng.normal(size=n), 0.0)
    x[:10] *= 8.0
    return x.astype(np.float32)


def _fq_mse(x, lo, hi, fmt, sym):
    s, z = qparams_from_range(lo, hi, fmt, sym)
    return float(jnp.mean((fake_quant(jnp.asarray(x), s, z, fmt) - x) ** 2))


def test_entropy_4bit_discrete_input_not_clipped_to_first_level():
    # Regression: at 4 bits the first KL candidate (128 of 2048 bins = amax / 16) held only the
    # first non-zero pixel level; with exact zeros left out, P and Q were the same single spike
    # and KL = 0, so the input was clipped at 1/16 (digits LeNet all-4-bit PTQ: 10 % accuracy).
    rng = np.random.default_rng(7)
    x = _pixels(rng)
    fmt = IntFormat(4, signed=False)
    ent, mse = entropy_observer(), mse_observer()
    state = run(ent, [x])  # both are 2048-bin histogram observers: one state serves both
    lo, hi = jax.jit(lambda s: ent.compute_range(s, fmt, False))(state)
    assert float(hi) >= np.median(x[x > 0]), float(hi)
    mlo, mhi = jax.jit(lambda s: mse.compute_range(s, fmt, False))(state)
    assert _fq_mse(x, lo, hi, fmt, False) <= 2.0 * _fq_mse(x, mlo, mhi, fmt, False) + 1e-6


@pytest.fixture(scope="module")
def entropy_states():
    rng = np.random.default_rng(8)
    obs = entropy_observer()
    return obs, [(x, run(obs, [x])) for x in (_pixels(rng), _relu_with_outliers(rng))]


@pytest.mark.parametrize("bits", range(2, 9))
def test_entropy_sensible_range_at_every_width(bits, entropy_states):
    # pixels: unsigned asymmetric and signed symmetric; ReLU data with outliers: unsigned
    obs, [(pix, pix_state), (relu, relu_state)] = entropy_states
    cases = ((pix, pix_state, IntFormat(bits, signed=False), False),
             (pix, pix_state, IntFormat(bits), True),
             (relu, relu_state, IntFormat(bits, signed=False), False))
    for data, state, fmt, sym in cases:
        lo, hi = obs.compute_range(state, fmt, sym)
        s, _ = qparams_from_range(lo, hi, fmt, sym)
        assert np.isfinite(float(s)) and float(s) > 0
        # the clip keeps at least the median of the non-zero values
        assert float(hi) >= np.median(data[data > 0]), (bits, str(fmt), sym, float(hi))


@pytest.mark.parametrize("amax", [2.6704421, 1.0, 0.7, 5.8039618])
def test_exact_zeros_binned_on_the_positive_side(amax):
    # Regression: (0 + amax) / (2 amax) * 2 bins rounded below `bins` for amax = 2.6704421 under
    # jit, so exact zeros went to the [-w, 0) bin while the zero removal emptied [0, w) instead.
    x = np.r_[np.zeros(50), [amax, -0.5 * amax, 1e-4 * amax, -1e-4 * amax]].astype(np.float32)
    state = run(entropy_observer(bins=2048), [x])
    hist = np.asarray(state["hist"])
    assert float(state["zeros"]) == 50
    assert hist[2048] == 51 and hist[2047] == 1, (hist[2047], hist[2048])


def _trt_entropy_threshold(h, width, levels, start=128):
    """TensorRT's entropy threshold on an ``|x|`` histogram ``h`` (pytorch-quantization's
    ``_compute_amax_entropy``), numpy reference: thresholds from bin ``start`` on, ``Q`` = 0
    where ``P`` > 0 an infinite KL (as scipy's), ties to the largest threshold."""
    divs = []
    for i in range(start, len(h) + 1):
        p = h[:i].astype(np.float64)
        p[i - 1] += h[i:].sum()
        grp = np.arange(i) * levels // i
        total = np.bincount(grp, weights=h[:i], minlength=levels)
        count = np.bincount(grp, weights=(h[:i] > 0).astype(float), minlength=levels)
        q = np.where(h[:i] > 0, total[grp] / np.maximum(count[grp], 1), 0.0)
        p, q = p / p.sum(), q / q.sum()  # scipy.stats.entropy(p, q), without its import time
        with np.errstate(divide="ignore", invalid="ignore"):  # p > 0 = q: inf, as scipy
            kl = p * (np.log(np.where(p > 0, p, 1.0)) - np.log(q))
        divs.append(np.sum(np.where(p > 0, kl, 0.0)))
    return (start + len(divs) - 1 - int(np.argmin(divs[::-1]))) * width


def test_entropy_levels_follow_the_asymmetric_grid():
    # An asymmetric grid (int8 or uint8 with a zero point) puts its 256 codes where the data
    # is: on one-signed (ReLU) data all of them over [0, t], TensorRT's unsigned quantizer (256
    # levels); on data symmetric about 0 half of them, its signed one (128). The levels used to
    # follow the storage's signedness: int8 on ReLU data got 128 levels (threshold 1024 bins
    # here, against the reference's 932), uint8 on symmetric data 256 (932 against 1024).
    a = np.abs(np.random.default_rng(3).normal(size=20_000)).astype(np.float32)
    bins = 1024
    h, _ = np.histogram(a, bins, range=(0, float(a.max())))
    width = float(a.max()) / bins
    obs = entropy_observer(bins=bins)
    for x, fmt, levels in ((a, I8, 256), (np.r_[a, -a], U8, 128)):
        lo, hi = obs.compute_range(run(obs, [x]), fmt, False)
        ref = _trt_entropy_threshold(h, width, levels, start=256)  # npujax starts at levels
        assert abs(float(hi) - ref) <= 1.01 * width, (str(fmt), float(hi) / width, ref / width)
        assert float(lo) == pytest.approx(max(float(x.min()), -float(hi)))


def test_entropy_of_zero_heavy_signed_data_matches_references():
    # PP-OCRv4 rec's 29th conv input (17 % exact zeros, a few % of values in a tail 8x past the
    # bulk, max 2.6704421): with the zeros left in the |x| histogram's first bin, the threshold
    # fell to 1/8 of the reference's and every timestep read as blank. With them left out, the
    # threshold is TensorRT's on the non-zero |x| histogram, and onnxruntime's EntropyCalibrater
    # algorithm (mirrored |x| histogram, 2 x 128 levels) lands within a bin of it.
    from onnxruntime.quantization.calibrate import HistogramCollector

    rng = np.random.default_rng(9)
    n = 40_000
    neg, pos = -np.abs(rng.laplace(0, 0.03, n)), np.abs(rng.laplace(0, 0.05, n))
    x = np.where(rng.uniform(size=n) < 0.5, neg, pos)
    x[rng.uniform(size=n) < 0.02] *= 10.0
    x[rng.uniform(size=n) < 0.17] = 0.0
    x = (x * (2.6704421 / x.max())).astype(np.float32)
    x[np.argmax(x)] = np.float32(2.6704421)
    a = np.abs(x[x != 0])
    for bins in (1024, 256):  # onnxruntime's Python loops get the small one
        obs = entropy_observer(bins=bins)
        lo, hi = obs.compute_range(run(obs, [x]), I8, True)
        h, _ = np.histogram(a, bins, range=(0, float(np.abs(x).max())))
        width = float(np.abs(x).max()) / bins
        ref = _trt_entropy_threshold(h, width, 128)
        assert abs(float(hi) - ref) <= 1.01 * width and float(lo) == -float(hi), (float(hi), ref)
        assert float(hi) > 4 * np.quantile(a, 0.9)  # not clipped into the bulk
    edges = np.linspace(-a.max(), a.max(), 2 * bins + 1).astype(np.float32)
    collector = HistogramCollector("entropy", True, 2 * bins, 256, None, None)
    mirrored = (np.r_[h[::-1], h], edges, np.float32(-a.max()), np.float32(a.max()))
    _, ort_hi = collector.get_entropy_threshold(mirrored, 256)
    assert abs(float(hi) - float(ort_hi)) <= 2.01 * width, (float(hi), float(ort_hi))
