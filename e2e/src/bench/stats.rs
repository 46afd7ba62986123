//! Pure figure maths: percentiles of samples, min/median/max over runs, ratios, targets and their
//! verdicts. Nothing here measures or prints.

use serde::Serialize;

/// The nearest-rank percentile `p` (0.0 to 1.0) of `sorted` (ascending), `None` when empty.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() - 1) as f64 * p.clamp(0.0, 1.0)).round() as usize;
    sorted.get(i).copied()
}

/// Sorts samples ascending (NaN last, never expected).
pub fn sorted(mut samples: Vec<f64>) -> Vec<f64> {
    samples.sort_by(f64::total_cmp);
    samples
}

/// Min, median and max of one figure over the runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    /// Smallest value.
    pub min: f64,
    /// Middle value (the mean of the two middle ones for an even count).
    pub median: f64,
    /// Largest value.
    pub max: f64,
}

impl Spread {
    /// The spread of `values`, `None` when there are none.
    pub fn of(values: &[f64]) -> Option<Self> {
        let v = sorted(values.to_vec());
        let n = v.len();
        let median = match n {
            0 => return None,
            _ if n % 2 == 1 => v[n / 2],
            _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        };
        Some(Self {
            min: v[0],
            median,
            max: v[n - 1],
        })
    }
}

/// Per-run ratios `this / comparator` of the runs that have both (and a non-zero comparator).
pub fn ratios(this: &[Option<f64>], comparator: &[Option<f64>]) -> Vec<f64> {
    this.iter()
        .zip(comparator)
        .filter_map(|(t, c)| match (t, c) {
            (Some(t), Some(c)) if *c != 0.0 => Some(t / c),
            _ => None,
        })
        .collect()
}

/// What a figure should reach.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Target {
    /// `this / comparator` at least this (rates).
    RatioAtLeast(f64),
    /// `this / comparator` at most this (latencies next to the echo bot).
    RatioAtMost(f64),
    /// The value itself at most this, in the figure's unit.
    AtMost(f64),
    /// The value at most the comparator's plus this, in the figure's unit (a bridge's own time
    /// next to a whole path it should add little to).
    WithinOf(f64),
}

/// Whether a figure reached its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Verdict {
    /// Reached.
    Pass,
    /// Missed (printed, never an error).
    Miss,
}

impl Verdict {
    /// `PASS` or `MISS`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pass => "PASS",
            Self::Miss => "MISS",
        }
    }
}

impl Target {
    /// How the target reads in the table, e.g. `≥ 0.9× curl` or `≤ 16 MiB`.
    pub fn text(&self, unit: &str, comparator: &str) -> String {
        match self {
            Self::RatioAtLeast(r) => format!("≥ {}× {comparator}", trim(*r)),
            Self::RatioAtMost(r) => format!("≤ {}× {comparator}", trim(*r)),
            Self::AtMost(v) => format!("≤ {} {unit}", trim(*v)),
            Self::WithinOf(v) => format!("≤ {comparator} + {} {unit}", trim(*v)),
        }
    }

    /// The verdict on the medians over the runs: `this` for an absolute target, the median of
    /// the per-run ratios for a relative one; `None` when that figure is missing.
    pub fn verdict(&self, this: Option<f64>, ratio: Option<f64>) -> Option<Verdict> {
        let pass = match *self {
            Self::RatioAtLeast(r) => ratio? >= r,
            Self::RatioAtMost(r) => ratio? <= r,
            Self::AtMost(v) => this? <= v,
            // The comparator is this / ratio (a ratio of 0 or none: no verdict).
            Self::WithinOf(v) => {
                let (this, ratio) = (this?, ratio.filter(|r| *r > 0.0)?);
                this - this / ratio <= v
            }
        };
        Some(if pass { Verdict::Pass } else { Verdict::Miss })
    }
}

/// A number for the table: three significant digits or so, no trailing zeros.
pub fn num(v: f64) -> String {
    let a = v.abs();
    let s = if a >= 100.0 || a == 0.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    };
    trim_str(s)
}

/// A spread as `min/median/max`, or the one value when they are equal.
pub fn spread_text(s: &Spread) -> String {
    if s.min == s.max {
        num(s.median)
    } else {
        format!("{}/{}/{}", num(s.min), num(s.median), num(s.max))
    }
}

fn trim(v: f64) -> String {
    trim_str(format!("{v}"))
}

fn trim_str(s: String) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let v = sorted(vec![5.0, 1.0, 4.0, 2.0, 3.0]);
        let cases = [
            (0.0, Some(1.0)),
            (0.5, Some(3.0)),
            (0.99, Some(5.0)),
            (1.0, Some(5.0)),
        ];
        for (p, want) in cases {
            assert_eq!(percentile(&v, p), want, "p={p}");
        }
        assert_eq!(percentile(&[], 0.5), None);
        assert_eq!(percentile(&[7.0], 0.99), Some(7.0));
    }

    #[test]
    fn spreads_over_runs() {
        type Case<'a> = (&'a [f64], Option<(f64, f64, f64)>);
        let cases: [Case; 4] = [
            (&[], None),
            (&[2.0], Some((2.0, 2.0, 2.0))),
            (&[3.0, 1.0, 2.0], Some((1.0, 2.0, 3.0))),
            (&[4.0, 1.0, 2.0, 3.0], Some((1.0, 2.5, 4.0))),
        ];
        for (values, want) in cases {
            let got = Spread::of(values).map(|s| (s.min, s.median, s.max));
            assert_eq!(got, want, "{values:?}");
        }
    }

    #[test]
    fn ratios_skip_runs_without_both_figures() {
        let this = [Some(90.0), None, Some(50.0), Some(1.0)];
        let other = [Some(100.0), Some(1.0), Some(0.0), Some(2.0)];
        assert_eq!(ratios(&this, &other), vec![0.9, 0.5]);
    }

    #[test]
    fn verdicts() {
        use Target::*;
        use Verdict::*;
        let cases = [
            (RatioAtLeast(0.9), None, Some(0.95), Some(Pass)),
            (RatioAtLeast(0.9), None, Some(0.9), Some(Pass)),
            (RatioAtLeast(0.9), None, Some(0.89), Some(Miss)),
            (RatioAtLeast(0.9), Some(5.0), None, None),
            (RatioAtMost(1.2), None, Some(1.1), Some(Pass)),
            (RatioAtMost(1.2), None, Some(1.3), Some(Miss)),
            (WithinOf(10.0), Some(12.0), Some(6.0), Some(Pass)),
            (WithinOf(10.0), Some(30.0), Some(3.0), Some(Miss)),
            (WithinOf(10.0), Some(3.0), None, None),
            (AtMost(16.0), Some(3.0), None, Some(Pass)),
            (AtMost(16.0), Some(17.5), Some(0.1), Some(Miss)),
            (AtMost(0.0), Some(0.0), None, Some(Pass)),
            (AtMost(5.0), None, Some(1.0), None),
        ];
        for (target, this, ratio, want) in cases {
            assert_eq!(
                target.verdict(this, ratio),
                want,
                "{target:?} {this:?} {ratio:?}"
            );
        }
    }

    #[test]
    fn target_and_number_text() {
        assert_eq!(
            Target::RatioAtLeast(0.9).text("MiB/s", "curl"),
            "≥ 0.9× curl"
        );
        assert_eq!(
            Target::RatioAtMost(1.2).text("ms", "echo bot"),
            "≤ 1.2× echo bot"
        );
        assert_eq!(Target::AtMost(16.0).text("MiB", ""), "≤ 16 MiB");
        let cases = [
            (0.0, "0"),
            (1234.56, "1235"),
            (56.78, "56.8"),
            (5.0, "5"),
            (1.25, "1.25"),
            (0.1234, "0.123"),
            (-2.5, "-2.5"),
        ];
        for (v, want) in cases {
            assert_eq!(num(v), want, "{v}");
        }
        let s = Spread {
            min: 1.0,
            median: 2.0,
            max: 30.0,
        };
        assert_eq!(spread_text(&s), "1/2/30");
        let one = Spread::of(&[4.5]).unwrap();
        assert_eq!(spread_text(&one), "4.5");
    }
}
