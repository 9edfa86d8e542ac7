//! The canary part of `kubectl proxyfleet get`: phase, steps with progress marks, metrics.
//! Shared by fleet and app rollouts.

use super::spec::{CanaryPhase, CanaryStatus, CanaryStrategy};

pub fn render(strategy: Option<&CanaryStrategy>, canary: &CanaryStatus) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "├─ canary {}  weight={}%  stable={}  canary={}\n",
        canary.phase,
        canary.weight,
        canary.stable_revision.as_deref().unwrap_or("-"),
        canary.canary_revision.as_deref().unwrap_or("-")
    ));
    for (i, s) in strategy
        .map(|c| c.steps.as_slice())
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let done = canary.phase == CanaryPhase::Completed;
        let mark = match (i as i32).cmp(&canary.current_step_index) {
            std::cmp::Ordering::Less => "✔",
            _ if done => "✔",
            std::cmp::Ordering::Equal => "▶",
            std::cmp::Ordering::Greater => " ",
        };
        let what = if let Some(w) = s.set_weight {
            format!("setWeight {w}")
        } else if let Some(p) = &s.pause {
            p.duration
                .map(|d| format!("pause {d}"))
                .unwrap_or_else(|| "pause (until promoted)".into())
        } else {
            "analysis".into()
        };
        out.push_str(&format!("│  {mark} step {i}: {what}\n"));
    }
    for m in &canary.metrics {
        out.push_str(&format!(
            "│  metric {} ({:?}): last={} ok={} failed={} inconclusive={} errors={}\n",
            m.name,
            m.analysis,
            m.last_value.as_deref().unwrap_or("-"),
            m.successes,
            m.failures,
            m.inconclusive,
            m.errors
        ));
    }
    if let Some(msg) = &canary.message {
        out.push_str(&format!("│  {msg}\n"));
    }
    out
}
