//! Status conditions, merged so `lastTransitionTime` moves only when a condition's status
//! really changes — the difference between a quiet controller and a status-write loop.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

pub const READY: &str = "Ready";
pub const PROGRESSING: &str = "Progressing";
pub const DEGRADED: &str = "Degraded";
pub const CERTIFICATES_READY: &str = "CertificatesReady";
pub const PROPAGATED: &str = "Propagated";

/// A condition as the reconciler wants it, without timestamps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Want {
    pub type_: &'static str,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

impl Want {
    pub fn new(type_: &'static str, status: bool, reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            type_,
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// Merges wanted conditions into the existing list. Conditions of other types are kept.
pub fn merge(existing: &[Condition], wanted: &[Want], generation: Option<i64>, now: &Time) -> Vec<Condition> {
    let mut out: Vec<Condition> = existing
        .iter()
        .filter(|c| !wanted.iter().any(|w| w.type_ == c.type_))
        .cloned()
        .collect();
    for w in wanted {
        let status = if w.status { "True" } else { "False" }.to_string();
        let previous = existing.iter().find(|c| c.type_ == w.type_);
        let last_transition_time = match previous {
            Some(p) if p.status == status => p.last_transition_time.clone(),
            _ => now.clone(),
        };
        out.push(Condition {
            type_: w.type_.to_string(),
            status,
            reason: w.reason.clone(),
            message: w.message.clone(),
            observed_generation: generation,
            last_transition_time,
        });
    }
    out.sort_by(|a, b| a.type_.cmp(&b.type_));
    out
}

pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions.iter().any(|c| c.type_ == type_ && c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn t(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn transition_time_moves_only_on_status_change() {
        let first = merge(&[], &[Want::new(READY, false, "Progressing", "0/2")], Some(1), &t(100));
        let same = merge(
            &first,
            &[Want::new(READY, false, "Progressing", "1/2")],
            Some(1),
            &t(200),
        );
        assert_eq!(same[0].last_transition_time, t(100));
        assert_eq!(same[0].message, "1/2");
        let flipped = merge(&same, &[Want::new(READY, true, "Ready", "2/2")], Some(1), &t(300));
        assert_eq!(flipped[0].last_transition_time, t(300));
    }

    #[test]
    fn other_conditions_are_kept() {
        let a = merge(&[], &[Want::new(CERTIFICATES_READY, true, "Issued", "")], None, &t(1));
        let b = merge(&a, &[Want::new(READY, true, "Ready", "")], None, &t(2));
        assert_eq!(b.len(), 2);
        assert!(is_true(&b, CERTIFICATES_READY));
    }
}
