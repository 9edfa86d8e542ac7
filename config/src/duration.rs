//! A duration written the way Kubernetes users write them ("250ms", "30s", "5m", "1h30m").

use std::{fmt, str::FromStr, time::Duration};

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The pattern both the CRD (OpenAPI) and the proxy's parser accept.
pub const DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$";

/// The longest duration, in seconds (about 31.7 years, so that whole seconds fit an `i32`, as
/// Kubernetes' `*Seconds` fields need); longer ones are read as this.
pub const MAX_SECS: f64 = 1e9;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct HumanDuration(pub Duration);

impl HumanDuration {
    pub const fn from_millis(ms: u64) -> Self {
        Self(Duration::from_millis(ms))
    }
    pub const fn from_secs(s: u64) -> Self {
        Self(Duration::from_secs(s))
    }
    pub fn get(self) -> Duration {
        self.0
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid duration {input:?}: expected a number followed by ms, s, m or h, like \"250ms\" or \"1m30s\"")]
pub struct DurationParseError {
    input: String,
}

impl FromStr for HumanDuration {
    type Err = DurationParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || DurationParseError { input: s.to_string() };
        if s.is_empty() {
            return Err(err());
        }
        let mut total = 0f64;
        let mut rest = s;
        while !rest.is_empty() {
            let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(err)?;
            if num_end == 0 {
                return Err(err());
            }
            let value: f64 = rest[..num_end].parse().map_err(|_| err())?;
            rest = &rest[num_end..];
            let (unit_secs, unit_len) = if rest.starts_with("ms") {
                (0.001, 2)
            } else if rest.starts_with('s') {
                (1.0, 1)
            } else if rest.starts_with('m') {
                (60.0, 1)
            } else if rest.starts_with('h') {
                (3600.0, 1)
            } else {
                return Err(err());
            };
            total += value * unit_secs;
            rest = &rest[unit_len..];
        }
        // Longer is read as the longest (about 31.7 years): every string the CRD's pattern admits
        // must decode, or one object would stop the operator's list of its kind for everyone.
        Ok(Self(Duration::from_secs_f64(total.min(MAX_SECS))))
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms.is_multiple_of(3_600_000) && ms > 0 {
            write!(f, "{}h", ms / 3_600_000)
        } else if ms.is_multiple_of(60_000) && ms > 0 {
            write!(f, "{}m", ms / 60_000)
        } else if ms.is_multiple_of(1000) {
            write!(f, "{}s", ms / 1000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for HumanDuration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": DURATION_PATTERN,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_compounds() {
        assert_eq!("250ms".parse::<HumanDuration>().unwrap().0, Duration::from_millis(250));
        assert_eq!("1m30s".parse::<HumanDuration>().unwrap().0, Duration::from_secs(90));
        assert_eq!("1.5s".parse::<HumanDuration>().unwrap().0, Duration::from_millis(1500));
        assert_eq!("2h".parse::<HumanDuration>().unwrap().0, Duration::from_secs(7200));
    }

    #[test]
    fn refuses_garbage() {
        for bad in ["", "10", "s", "10x", "-1s", "1s2", "abc", "1e999h"] {
            assert!(bad.parse::<HumanDuration>().is_err(), "{bad}");
        }
    }

    #[test]
    fn whatever_the_pattern_admits_is_read_and_the_longest_is_about_31_years() {
        let longest = Duration::from_secs(1_000_000_000);
        let nines = "9".repeat(400);
        for long in [
            "277778h",
            "300000h",
            "999999999999999999999h",
            &format!("{nines}h"),
            "1000000001s",
        ] {
            assert!(regex_lite_matches(long), "{long} is admitted by the CRD");
            assert_eq!(long.parse::<HumanDuration>().unwrap().0, longest, "{long}");
        }
        assert_eq!(
            "277777h".parse::<HumanDuration>().unwrap().0,
            Duration::from_secs(277_777 * 3600)
        );
    }

    /// `DURATION_PATTERN` by hand (no regex engine in this crate).
    fn regex_lite_matches(s: &str) -> bool {
        let mut rest = s;
        while !rest.is_empty() {
            let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
            if digits == 0 {
                return false;
            }
            rest = rest[digits..]
                .strip_prefix("ms")
                .or_else(|| rest[digits..].strip_prefix(['s', 'm', 'h']))
                .unwrap_or("!");
            if rest == "!" {
                return false;
            }
        }
        !s.is_empty()
    }

    #[test]
    fn displays_round_trip() {
        for d in ["250ms", "30s", "5m", "2h", "0s"] {
            assert_eq!(d.parse::<HumanDuration>().unwrap().to_string(), d);
        }
    }
}
