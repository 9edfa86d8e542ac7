//! Pure: the waves of a hub fleet as a tree, for `kubectl proxyfleet get pxd NAME`.

use super::spec::{ClusterStatus, WaveStatus};

pub fn render(waves: &WaveStatus, clusters: &[ClusterStatus]) -> String {
    let mut out = format!(
        "├─ waves {}  revision={} stable={}  wave {}/{}{}\n",
        waves.phase.as_str(),
        waves.revision,
        waves.stable_revision.as_deref().unwrap_or("-"),
        waves.current_wave + 1,
        waves.waves.len().max(1),
        waves.message.as_deref().map(|m| format!("  ({m})")).unwrap_or_default()
    );
    for (i, w) in waves.waves.iter().enumerate() {
        let mark = if i as u32 == waves.current_wave { "▶ " } else { "" };
        let (branch, indent) = if i + 1 == waves.waves.len() {
            ("└─", " ")
        } else {
            ("├─", "│")
        };
        out.push_str(&format!("│  {branch} {mark}{}\n", w.name));
        for (j, name) in w.clusters.iter().enumerate() {
            let leaf = if j + 1 == w.clusters.len() { "└─" } else { "├─" };
            let c = clusters.iter().find(|c| &c.name == name);
            let field = |f: Option<String>| f.unwrap_or_else(|| "-".into());
            let retrying = if waves.retrying.contains(name) {
                "  RETRYING (resume asked its canary to retry)"
            } else {
                ""
            };
            out.push_str(&format!(
                "│  {indent}   {leaf} {name}  revision={} canary={} step={} weight={} ready={}{}{retrying}\n",
                field(c.and_then(|c| c.revision.clone())),
                field(c.and_then(|c| c.canary_phase.clone())),
                field(c.and_then(|c| c.canary_step).map(|s| s.to_string())),
                field(c.and_then(|c| c.canary_weight).map(|s| s.to_string())),
                field(c.and_then(|c| c.ready).map(|s| s.to_string())),
                if c.is_some_and(|c| !c.reachable) {
                    "  UNREACHABLE"
                } else {
                    ""
                }
            ));
            let twig = if j + 1 == w.clusters.len() { " " } else { "│" };
            for app in c.map(|c| c.apps.as_slice()).unwrap_or_default() {
                out.push_str(&format!(
                    "│  {indent}   {twig}    app {}  revision={} canary={} weight={} ready={}\n",
                    app.name,
                    field(app.revision.clone()),
                    field(app.canary_phase.clone()),
                    field(app.weight.map(|s| s.to_string())),
                    field(app.ready.map(|s| s.to_string())),
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::propagation::spec::{WaveEntry, WavePhase};

    #[test]
    fn shows_the_current_wave_and_each_members_canary() {
        let w = WaveStatus {
            revision: "ab12".into(),
            phase: WavePhase::Soaking,
            current_wave: 1,
            waves: vec![
                WaveEntry {
                    name: "first".into(),
                    clusters: vec!["m1".into()],
                },
                WaveEntry {
                    name: "rest".into(),
                    clusters: vec!["m2".into()],
                },
            ],
            retrying: vec!["m1".into()],
            ..Default::default()
        };
        let clusters = [ClusterStatus {
            name: "m2".into(),
            reachable: false,
            revision: Some("ab12".into()),
            canary_phase: Some("Analyzing".into()),
            canary_step: Some(2),
            apps: vec![crate::propagation::spec::ClusterAppStatus {
                name: "shop".into(),
                canary_phase: Some("Progressing".into()),
                weight: Some(30),
                ..Default::default()
            }],
            ..Default::default()
        }];
        let text = render(&w, &clusters);
        assert!(text.contains("waves Soaking  revision=ab12"), "{text}");
        assert!(text.contains("wave 2/2"), "{text}");
        assert!(text.contains("▶ rest"), "{text}");
        assert!(text.contains("m2  revision=ab12 canary=Analyzing step=2"), "{text}");
        assert!(text.contains("UNREACHABLE"), "{text}");
        assert!(
            text.contains("m1  revision=- canary=- step=- weight=- ready=-  RETRYING"),
            "{text}"
        );
        assert!(
            text.contains("app shop  revision=- canary=Progressing weight=30"),
            "{text}"
        );
    }
}
