//! Judging one measurement window: pure functions over request counts and latency buckets.

use super::spec::{Metric, OnNoData, Threshold};

/// What a proxy track served during a window.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Window {
    pub requests: f64,
    pub errors_5xx: f64,
    /// Cumulative histogram buckets (upper bound in seconds, count), `+Inf` last.
    pub buckets: Vec<(f64, f64)>,
    /// P99 computed elsewhere (by Prometheus); wins over the buckets.
    pub p99_ms: Option<f64>,
}

impl Window {
    pub fn error_rate_percent(&self) -> Option<f64> {
        (self.requests > 0.0).then(|| 100.0 * self.errors_5xx / self.requests)
    }

    /// P99 in milliseconds by linear interpolation inside the bucket, as histogram_quantile does.
    pub fn p99_ms(&self) -> Option<f64> {
        self.p99_ms
            .or_else(|| quantile(0.99, &self.buckets).map(|s| s * 1000.0))
    }
}

pub fn quantile(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut prev_bound = 0.0;
    let mut prev_count = 0.0;
    for &(bound, count) in buckets {
        if count >= rank {
            if bound.is_infinite() {
                return Some(prev_bound);
            }
            let in_bucket = count - prev_count;
            if in_bucket <= 0.0 {
                return Some(bound);
            }
            return Some(prev_bound + (bound - prev_bound) * (rank - prev_count) / in_bucket);
        }
        prev_bound = bound;
        prev_count = count;
    }
    Some(prev_bound)
}

/// One metric's verdict for one measurement.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    Success(f64),
    Failure(f64),
    Inconclusive(String),
    /// The source could not be asked (counts toward consecutiveErrorLimit, never as a pass).
    Error(String),
}

fn within(value: f64, threshold: &Threshold, stable: Option<f64>, floor: f64) -> bool {
    let abs_ok = threshold.max.is_none_or(|m| value <= m);
    let rel_ok = match (threshold.relative_to_stable, stable) {
        (Some(pct), Some(s)) => value <= s.max(floor) * (1.0 + pct / 100.0),
        // Relative limit without a stable baseline: judged by the absolute limit only.
        _ => true,
    };
    abs_ok && rel_ok
}

/// A threshold that is only relative to stable cannot judge without stable's figure (stable
/// quiet, or scaled to 0 at `setWeight: 100`): no data, never a pass.
fn baseline_missing(threshold: &Threshold, stable: Option<f64>) -> Option<String> {
    (threshold.max.is_none() && threshold.relative_to_stable.is_some() && stable.is_none())
        .then(|| "no stable figure to compare with (relativeToStable without max)".to_string())
}

/// Judges a built-in metric on the canary's window (and stable's, for relative limits).
pub fn judge_builtin(
    metric: &Metric,
    canary: &Window,
    stable: Option<&Window>,
    min_requests: i64,
    on_no_data: OnNoData,
) -> Verdict {
    let no_data = |why: String| match on_no_data {
        OnNoData::Inconclusive => Verdict::Inconclusive(why),
        OnNoData::Fail => Verdict::Failure(f64::NAN),
    };
    if canary.requests < min_requests as f64 {
        return no_data(format!(
            "{} canary requests in the window, fewer than minRequests {min_requests}",
            canary.requests
        ));
    }
    if let Some(t) = &metric.p99_latency_ms {
        let Some(v) = canary.p99_ms() else {
            return no_data("no latency samples".into());
        };
        let s = stable.and_then(|w| (w.requests >= 1.0).then(|| w.p99_ms()).flatten());
        if let Some(why) = baseline_missing(t, s) {
            return no_data(why);
        }
        return if within(v, t, s, 1.0) {
            Verdict::Success(v)
        } else {
            Verdict::Failure(v)
        };
    }
    if let Some(t) = &metric.error_rate5xx {
        let Some(v) = canary.error_rate_percent() else {
            return no_data("no requests".into());
        };
        let s = stable.and_then(|w| w.error_rate_percent());
        if let Some(why) = baseline_missing(t, s) {
            return no_data(why);
        }
        return if within(v, t, s, 0.1) {
            Verdict::Success(v)
        } else {
            Verdict::Failure(v)
        };
    }
    Verdict::Error("not a built-in metric".into())
}

/// Evaluates `result OP number` (the prometheus metric's successCondition).
pub fn condition_holds(condition: &str, result: f64) -> Option<bool> {
    let rest = condition.trim().strip_prefix("result")?.trim_start();
    let (op, num) = ["<=", ">=", "==", "!=", "<", ">"]
        .iter()
        .find_map(|op| rest.strip_prefix(op).map(|n| (*op, n.trim())))?;
    let n: f64 = num.parse().ok()?;
    Some(match op {
        "<=" => result <= n,
        ">=" => result >= n,
        "==" => (result - n).abs() < f64::EPSILON,
        "!=" => (result - n).abs() >= f64::EPSILON,
        "<" => result < n,
        _ => result > n,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(requests: f64, errors: f64, buckets: &[(f64, f64)]) -> Window {
        Window {
            requests,
            errors_5xx: errors,
            buckets: buckets.to_vec(),
            p99_ms: None,
        }
    }

    fn metric(p99: Option<f64>, err: Option<f64>, rel: Option<f64>) -> Metric {
        Metric {
            name: "m".into(),
            p99_latency_ms: p99.map(|m| Threshold {
                max: Some(m),
                relative_to_stable: rel,
            }),
            error_rate5xx: err.map(|m| Threshold {
                max: Some(m),
                relative_to_stable: rel,
            }),
            prometheus: None,
        }
    }

    #[test]
    fn quantile_interpolates_like_prometheus() {
        // 100 requests: 90 under 1ms, 9 in (1ms, 10ms], 1 in (10ms, 100ms].
        let b = [(0.001, 90.0), (0.01, 99.0), (0.1, 100.0), (f64::INFINITY, 100.0)];
        let p99 = quantile(0.99, &b).unwrap();
        assert!((p99 - 0.01).abs() < 1e-9, "{p99}");
        let p50 = quantile(0.5, &b).unwrap();
        assert!(p50 > 0.0 && p50 < 0.001);
    }

    #[test]
    fn latency_and_error_verdicts() {
        let fast = window(100.0, 0.0, &[(0.001, 100.0), (f64::INFINITY, 100.0)]);
        let slow = window(100.0, 0.0, &[(0.001, 50.0), (0.5, 100.0), (f64::INFINITY, 100.0)]);
        assert!(matches!(
            judge_builtin(
                &metric(Some(100.0), None, None),
                &fast,
                None,
                20,
                OnNoData::Inconclusive
            ),
            Verdict::Success(_)
        ));
        assert!(matches!(
            judge_builtin(
                &metric(Some(100.0), None, None),
                &slow,
                None,
                20,
                OnNoData::Inconclusive
            ),
            Verdict::Failure(_)
        ));
        let errors = window(100.0, 20.0, &[]);
        assert_eq!(
            judge_builtin(
                &metric(None, Some(5.0), None),
                &errors,
                None,
                20,
                OnNoData::Inconclusive
            ),
            Verdict::Failure(20.0)
        );
        let fine = window(100.0, 1.0, &[]);
        assert_eq!(
            judge_builtin(&metric(None, Some(5.0), None), &fine, None, 20, OnNoData::Inconclusive),
            Verdict::Success(1.0)
        );
    }

    #[test]
    fn too_few_requests_is_inconclusive_or_failure_by_policy() {
        let quiet = window(3.0, 3.0, &[]);
        assert!(matches!(
            judge_builtin(&metric(None, Some(5.0), None), &quiet, None, 20, OnNoData::Inconclusive),
            Verdict::Inconclusive(_)
        ));
        assert!(matches!(
            judge_builtin(&metric(None, Some(5.0), None), &quiet, None, 20, OnNoData::Fail),
            Verdict::Failure(_)
        ));
    }

    #[test]
    fn relative_to_stable() {
        let m = Metric {
            name: "m".into(),
            p99_latency_ms: Some(Threshold {
                max: None,
                relative_to_stable: Some(50.0),
            }),
            error_rate5xx: None,
            prometheus: None,
        };
        let stable = window(100.0, 0.0, &[(0.01, 100.0), (f64::INFINITY, 100.0)]); // p99 ≈ 9.9ms
        let canary_ok = window(100.0, 0.0, &[(0.012, 100.0), (f64::INFINITY, 100.0)]);
        let canary_bad = window(100.0, 0.0, &[(0.05, 100.0), (f64::INFINITY, 100.0)]);
        assert!(matches!(
            judge_builtin(&m, &canary_ok, Some(&stable), 20, OnNoData::Inconclusive),
            Verdict::Success(_)
        ));
        assert!(matches!(
            judge_builtin(&m, &canary_bad, Some(&stable), 20, OnNoData::Inconclusive),
            Verdict::Failure(_)
        ));
    }

    /// Without stable's figure, a threshold relative to stable alone is no data, never a pass
    /// (a canary at 100 % 5xx used to pass when stable was scaled to 0); with `max` too, the
    /// absolute limit judges.
    #[test]
    fn relative_only_without_a_stable_figure_is_no_data() {
        let only_relative = Metric {
            name: "m".into(),
            p99_latency_ms: None,
            error_rate5xx: Some(Threshold {
                max: None,
                relative_to_stable: Some(50.0),
            }),
            prometheus: None,
        };
        let failing = window(100.0, 100.0, &[]);
        let quiet_stable = window(0.0, 0.0, &[]);
        for stable in [None, Some(&quiet_stable)] {
            assert!(matches!(
                judge_builtin(&only_relative, &failing, stable, 20, OnNoData::Inconclusive),
                Verdict::Inconclusive(_)
            ));
            assert!(matches!(
                judge_builtin(&only_relative, &failing, stable, 20, OnNoData::Fail),
                Verdict::Failure(_)
            ));
        }
        assert_eq!(
            judge_builtin(
                &metric(None, Some(5.0), Some(50.0)),
                &failing,
                None,
                20,
                OnNoData::Inconclusive
            ),
            Verdict::Failure(100.0)
        );
    }

    #[test]
    fn success_conditions() {
        assert_eq!(condition_holds("result < 0.5", 0.2), Some(true));
        assert_eq!(condition_holds("result>=10", 9.0), Some(false));
        assert_eq!(condition_holds("result == 1", 1.0), Some(true));
        assert_eq!(condition_holds("nonsense", 1.0), None);
    }
}
