//! When a fleet's ACME certificate needs an order, and how long to wait after a failure: pure
//! decisions over the current certificate, the order in flight and the failures recorded in
//! status (so a restarted or newly elected operator keeps the same backoff).

use std::time::Duration;

use super::issue::{rfc3339, CertInfo};
use super::spec::AcmeStatus;

/// The ACME part of the fleet's status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AcmeRecord {
    /// Orders failed in a row since the last certificate.
    pub failures: u32,
    /// When the last order failed (unix seconds).
    pub last_failure_at: Option<i64>,
    /// A wait the ACME server asked for (Retry-After, unix seconds), e.g. when rate-limited.
    pub retry_after: Option<i64>,
    /// The server's words for the last failure.
    pub last_error: Option<String>,
}

fn unix(t: &Option<String>) -> Option<i64> {
    let t = t.as_deref()?;
    time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
        .ok()
        .map(|t| t.unix_timestamp())
}

impl AcmeRecord {
    pub fn from_status(status: Option<&AcmeStatus>) -> Self {
        let Some(s) = status else { return Self::default() };
        Self {
            failures: s.failures,
            last_failure_at: unix(&s.last_failure_time),
            retry_after: None,
            last_error: s.last_error.clone(),
        }
        .with_next(unix(&s.next_attempt_time))
    }

    /// A recorded next attempt later than the backoff's is the server's Retry-After.
    fn with_next(mut self, next: Option<i64>) -> Self {
        if next > next_attempt(&self) {
            self.retry_after = next;
        }
        self
    }

    pub fn to_status(&self, account: Option<String>) -> AcmeStatus {
        AcmeStatus {
            failures: self.failures,
            last_failure_time: self.last_failure_at.map(rfc3339),
            next_attempt_time: next_attempt(self).map(rfc3339),
            last_error: self.last_error.clone(),
            account,
        }
    }

    /// One more failed order at `now`.
    pub fn failed(&self, now: i64, message: String, retry_after: Option<i64>) -> Self {
        Self {
            failures: self.failures.saturating_add(1),
            last_failure_at: Some(now),
            retry_after,
            last_error: Some(message),
        }
    }
}

/// What to do now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// The certificate is good: look again at `recheck`.
    Serve { recheck: Duration },
    /// An order runs: look again soon.
    InFlight,
    /// Start an order (first certificate, other names, or renewal due).
    Order { reason: &'static str },
    /// A failure's backoff has not passed.
    Wait { until: i64 },
}

/// Renewal at two thirds of the lifetime (Let's Encrypt's advice, and what cert-manager does).
pub fn renewal_time(info: &CertInfo) -> i64 {
    info.not_before + (info.not_after - info.not_before) * 2 / 3
}

/// One minute after the first failure, doubling to at most six hours; never sooner than the
/// server's Retry-After.
pub fn next_attempt(record: &AcmeRecord) -> Option<i64> {
    let at = record.last_failure_at?;
    let exp = record.failures.saturating_sub(1).min(9);
    let backoff = (60i64 << exp).min(6 * 3600);
    Some((at + backoff).max(record.retry_after.unwrap_or(i64::MIN)))
}

/// `names_match`: the current certificate was ordered for exactly the fleet's hostnames.
pub fn step(current: Option<&CertInfo>, names_match: bool, in_flight: bool, record: &AcmeRecord, now: i64) -> Step {
    if in_flight {
        return Step::InFlight;
    }
    let reason = match current {
        None => "no certificate yet",
        Some(_) if !names_match => "the hostnames changed",
        Some(info) if now >= renewal_time(info) => "renewal due",
        Some(info) => {
            return Step::Serve {
                recheck: Duration::from_secs((renewal_time(info) - now).clamp(1, 3600) as u64),
            }
        }
    };
    match next_attempt(record) {
        Some(until) if until > now => Step::Wait { until },
        _ => Step::Order { reason },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cert(not_before: i64, not_after: i64) -> CertInfo {
        CertInfo {
            serial: "1".into(),
            issuer: "Pebble".into(),
            subject: String::new(),
            not_before,
            not_after,
            dns_names: vec!["demo.example.com".into()],
            is_ca: false,
        }
    }

    #[test]
    fn renews_at_two_thirds() {
        let c = cert(0, 90);
        assert_eq!(
            step(Some(&c), true, false, &AcmeRecord::default(), 59),
            Step::Serve {
                recheck: Duration::from_secs(1)
            }
        );
        assert_eq!(
            step(Some(&c), true, false, &AcmeRecord::default(), 60),
            Step::Order { reason: "renewal due" }
        );
        assert_eq!(
            step(Some(&c), false, false, &AcmeRecord::default(), 10),
            Step::Order {
                reason: "the hostnames changed"
            }
        );
        assert_eq!(step(None, false, true, &AcmeRecord::default(), 10), Step::InFlight);
    }

    #[test]
    fn backs_off_and_honours_retry_after() {
        let r = AcmeRecord {
            failures: 3,
            last_failure_at: Some(1000),
            ..Default::default()
        };
        assert_eq!(next_attempt(&r), Some(1000 + 240));
        assert_eq!(step(None, false, false, &r, 1100), Step::Wait { until: 1240 });
        assert_eq!(
            step(None, false, false, &r, 1240),
            Step::Order {
                reason: "no certificate yet"
            }
        );
        let limited = AcmeRecord {
            retry_after: Some(5000),
            ..r
        };
        assert_eq!(next_attempt(&limited), Some(5000));
    }

    #[test]
    fn the_record_survives_a_round_trip_through_status() {
        let r = AcmeRecord::default().failed(1_700_000_000, "no".into(), Some(1_700_009_000));
        let back = AcmeRecord::from_status(Some(&r.to_status(None)));
        assert_eq!(back, r);
        let plain = AcmeRecord::default().failed(1_700_000_000, "no".into(), None);
        assert_eq!(AcmeRecord::from_status(Some(&plain.to_status(None))), plain);
    }

    proptest! {
        /// Never two orders at once, and never an order before the backoff has passed.
        #[test]
        fn orders_respect_flight_and_backoff(failures in 0u32..40, at in 0i64..1_000_000, now in 0i64..2_000_000,
                                             in_flight: bool, has_cert: bool, names_match: bool) {
            let record = AcmeRecord { failures, last_failure_at: (failures > 0).then_some(at), ..Default::default() };
            let c = cert(0, 1_500_000);
            let s = step(has_cert.then_some(&c), names_match, in_flight, &record, now);
            if in_flight { prop_assert_eq!(s.clone(), Step::InFlight); }
            if let Step::Order { .. } = s {
                prop_assert!(next_attempt(&record).is_none_or(|t| t <= now));
            }
            if let Step::Wait { until } = s { prop_assert!(until > now); }
        }
    }
}
