//! The live weights of an app rollout: what the canary gets in each phase, the document the
//! proxies take, and where it is kept so a restarted proxy starts with it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use proxyfleet_config::LiveWeights;

use super::objects::AppOwner;
use super::render::{track_name, AppTrack};
use crate::canary::spec::{CanaryPhase, CanaryStatus};
use crate::labels;

/// The ConfigMap every proxy of a fleet mounts (optional) as its live-weights directory.
pub fn config_map_name(fleet: &str) -> String {
    format!("{fleet}-weights")
}

/// The Secret whose `token` authorises weight pushes to a fleet's admin listeners.
pub fn token_secret_name(fleet: &str) -> String {
    format!("{fleet}-admin-token")
}

pub const TOKEN_KEY: &str = "token";

/// Whether a canary runs and serves (so forced routing to it may apply): from its first weight
/// on, which it reaches only with ready pods; before that, testers forced to it would meet a
/// Service with no endpoints.
pub fn canary_running(status: Option<&CanaryStatus>) -> bool {
    status.is_some_and(|s| {
        s.weight > 0
            && matches!(
                s.phase,
                CanaryPhase::Progressing | CanaryPhase::Paused | CanaryPhase::Analyzing | CanaryPhase::Promoting
            )
    })
}

/// The canary's share while the machine is in `status`: its weight during a rollout (kept
/// while stable takes the new template at promotion), none otherwise. After promotion stable
/// runs the new version, so every user lands there; after an abort, on the old one.
pub fn canary_weight(status: Option<&CanaryStatus>) -> u8 {
    let Some(s) = status else { return 0 };
    match s.phase {
        CanaryPhase::Progressing | CanaryPhase::Paused | CanaryPhase::Analyzing | CanaryPhase::Promoting => {
            s.weight.clamp(0, 100) as u8
        }
        CanaryPhase::Idle | CanaryPhase::Completed | CanaryPhase::Aborted => 0,
    }
}

/// `forced`: whether `canaryMatch` applies (only while a canary runs).
pub fn document(owner: &AppOwner, route: &str, generation: u64, canary: u8, forced: bool) -> LiveWeights {
    LiveWeights {
        route: route.to_string(),
        generation,
        weights: BTreeMap::from([
            (track_name(&owner.name, AppTrack::Canary), canary),
            (track_name(&owner.name, AppTrack::Stable), 100 - canary.min(100)),
        ]),
        overrides: forced,
    }
}

/// The generation to push `doc` under: its own, or past every document `held` (by a pod or the
/// ConfigMap) for the same route at that generation or later with other weights, and no lower
/// than one already held with these weights. A pass whose status write failed leaves such
/// documents behind; pushed again under a generation a proxy already has, new weights would be
/// ignored. Every document held at the result or later then has these weights.
pub fn generation_past<'a>(doc: &LiveWeights, held: impl IntoIterator<Item = &'a LiveWeights>) -> u64 {
    held.into_iter()
        .filter(|h| h.route == doc.route)
        .fold(doc.generation, |generation, h| {
            if h.weights == doc.weights && h.overrides == doc.overrides {
                generation.max(h.generation)
            } else if h.generation >= doc.generation {
                generation.max(h.generation + 1)
            } else {
                generation
            }
        })
}

/// This rollout's key of the fleet's weights ConfigMap (applied with a field manager of its
/// own, so rollouts of other routes keep their keys).
pub fn config_map(owner: &AppOwner, fleet: &str, doc: &LiveWeights) -> ConfigMap {
    let mut meta = owner.meta(
        config_map_name(fleet),
        BTreeMap::from([(labels::MANAGED_BY.to_string(), labels::MANAGER.to_string())]),
    );
    // Several rollouts may share the map: none of them controls it.
    if let Some(r) = meta.owner_references.as_mut().and_then(|v| v.first_mut()) {
        r.controller = Some(false);
    }
    ConfigMap {
        metadata: meta,
        data: Some(BTreeMap::from([(format!("{}.json", owner.name), doc.to_json())])),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(generation: u64, canary: u8) -> LiveWeights {
        LiveWeights {
            route: "web".into(),
            generation,
            weights: BTreeMap::from([("c".to_string(), canary), ("s".to_string(), 100 - canary)]),
            overrides: true,
        }
    }

    #[test]
    fn weights_already_pushed_under_the_generation_move_it_on() {
        let want = doc(5, 0);
        // Nothing held, older documents, or the same weights: the generation stands, or rises
        // to where these weights already are.
        assert_eq!(generation_past(&want, []), 5);
        assert_eq!(generation_past(&want, [&doc(4, 50), &doc(5, 0)]), 5);
        assert_eq!(generation_past(&want, [&doc(4, 50), &doc(7, 0)]), 7);
        // A failed pass pushed 50 % under 5: the abort's 0 % goes under 6.
        assert_eq!(generation_past(&want, [&doc(5, 50)]), 6);
        assert_eq!(generation_past(&want, [&doc(9, 50), &doc(5, 0)]), 10);
        assert_eq!(
            generation_past(&want, [&doc(6, 50), &doc(7, 0)]),
            7,
            "the 50 % under 6 is passed"
        );
        assert_eq!(generation_past(&want, [&doc(7, 50), &doc(7, 0)]), 8);
        // Another route's documents do not count; nor does `overrides` alone go unnoticed.
        let mut other = doc(5, 50);
        other.route = "api".into();
        assert_eq!(generation_past(&want, [&other]), 5);
        let mut forced = doc(5, 0);
        forced.overrides = false;
        assert_eq!(generation_past(&want, [&forced]), 6);
    }

    #[test]
    fn the_canary_has_weight_only_inside_a_rollout() {
        let status = |phase, weight| CanaryStatus {
            phase,
            weight,
            ..Default::default()
        };
        assert_eq!(canary_weight(None), 0);
        assert_eq!(canary_weight(Some(&status(CanaryPhase::Progressing, 30))), 30);
        assert_eq!(canary_weight(Some(&status(CanaryPhase::Promoting, 100))), 100);
        assert_eq!(canary_weight(Some(&status(CanaryPhase::Completed, 100))), 0);
        assert_eq!(canary_weight(Some(&status(CanaryPhase::Aborted, 30))), 0);
    }
}
