// Exponential moving average with TensorBoard's debiasing (tensorboard/plugins/scalar/tf_scalar_dashboard
// `smoothing`): the running average starts at 0 and is divided by (1 - w^n), so the first points are
// not pulled towards zero. Non-finite values pass through unchanged and do not enter the average.

/** Default smoothing weight, as in TensorBoard and VisualDL. */
export const DEFAULT_SMOOTHING = 0.6;

/**
 * Incremental debiased EMA, so a live series is smoothed once per new point rather than from the
 * start on every frame.
 */
export class Ema {
  /**
   * @param {number} weight in [0, 1); 0 means no smoothing
   * @throws {RangeError} when weight is outside [0, 1)
   */
  constructor(weight = DEFAULT_SMOOTHING) {
    if (!(weight >= 0 && weight < 1)) throw new RangeError(`weight must be in [0, 1), got ${weight}`);
    this.weight = weight;
    this.reset();
  }

  /**
   * An EMA that continues from an already smoothed value (no debiasing left to do), for smoothing
   * a stretch of a series whose earlier part was smoothed elsewhere.
   * @param {number} weight in [0, 1)
   * @param {number} smoothed the smoothed value just before the stretch
   */
  static continuing(weight, smoothed) {
    const ema = new Ema(weight);
    if (Number.isFinite(smoothed)) {
      ema._last = smoothed;
      ema._count = Infinity; // weight^Infinity = 0: the debias divisor is 1
      ema._debiased = true;
    }
    return ema;
  }

  /** Forget every point seen. */
  reset() {
    this._last = 0;
    this._count = 0;
    /** Whether weight^count no longer changes 1 - weight^count (nor will for a larger count). */
    this._debiased = this.weight === 0;
  }

  /**
   * Feed one value and return its smoothed value.
   * @param {number} value
   * @returns {number}
   */
  next(value) {
    if (!Number.isFinite(value)) return value;
    this._last = this._last * this.weight + (1 - this.weight) * value;
    this._count += 1;
    if (this._debiased) return this._last;
    // Once 1 - weight^count rounds to 1 it stays 1 (weight^count only falls): the divisor is
    // then exactly 1 and the per-point Math.pow is left out (a weight of 0.6 gets there at the
    // 74th point, 0.99 at the 3,725th; a selection of 100 runs smooths 200,000 points).
    const debias = 1 - Math.pow(this.weight, this._count);
    if (debias === 1) this._debiased = true;
    return this._last / debias;
  }

  /**
   * Smooth `values[from..]` into `out[from..]`, continuing from the state left by earlier calls.
   * @param {ArrayLike<number>} values
   * @param {Float64Array|number[]} out may be the same array as `values`
   * @param {number} from first index to smooth
   */
  fill(values, out, from = 0) {
    for (let i = from; i < values.length; i++) out[i] = this.next(values[i]);
  }
}

/**
 * Smooth a whole series at once.
 * @param {ArrayLike<number>} values
 * @param {number} weight in [0, 1)
 * @returns {Float64Array}
 */
export function smooth(values, weight = DEFAULT_SMOOTHING) {
  const out = new Float64Array(values.length);
  new Ema(weight).fill(values, out);
  return out;
}
