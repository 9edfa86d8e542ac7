//! Whether this process runs under a CPU quota: a Kubernetes CPU limit, or any cgroup `cpu.max`
//! (v2) / `cpu.cfs_quota_us` (v1) on its cgroup or a parent it can see. Read once at start-up.

use std::path::Path;

/// True when the cgroup this process is in, or a parent of it, caps its CPU time.
pub fn under_cpu_quota() -> bool {
    let Ok(cgroups) = std::fs::read_to_string("/proc/self/cgroup") else {
        return false;
    };
    cgroups
        .lines()
        .filter_map(parse_cgroup_line)
        .any(|(controllers, path)| {
            if controllers.is_empty() {
                capped(Path::new("/sys/fs/cgroup"), path, "cpu.max", v2_capped)
            } else if controllers.split(',').any(|c| c == "cpu") {
                let mount = format!("/sys/fs/cgroup/{controllers}");
                let mount = if Path::new(&mount).exists() {
                    mount
                } else {
                    "/sys/fs/cgroup/cpu".into()
                };
                capped(Path::new(&mount), path, "cpu.cfs_quota_us", v1_capped)
            } else {
                false
            }
        })
}

/// `hierarchy-id:controllers:path` → (controllers, path); v2's line has no controllers.
fn parse_cgroup_line(line: &str) -> Option<(&str, &str)> {
    let mut parts = line.splitn(3, ':');
    let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
    Some((controllers, path))
}

/// Whether `file` caps the CPU in the cgroup at `path` below `mount` or in any parent of it.
fn capped(mount: &Path, path: &str, file: &str, is_cap: fn(&str) -> bool) -> bool {
    let mut dir = Some(Path::new(path));
    while let Some(d) = dir {
        let at = mount.join(d.strip_prefix("/").unwrap_or(d)).join(file);
        if std::fs::read_to_string(at).is_ok_and(|s| is_cap(&s)) {
            return true;
        }
        dir = d.parent();
    }
    false
}

/// cgroup v2 `cpu.max`: `max 100000` when uncapped, `25000 100000` when capped.
fn v2_capped(cpu_max: &str) -> bool {
    cpu_max.split_whitespace().next().is_some_and(|q| q != "max")
}

/// cgroup v1 `cpu.cfs_quota_us`: -1 when uncapped.
fn v1_capped(quota: &str) -> bool {
    quota.trim().parse::<i64>().is_ok_and(|q| q > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_cgroup_versions() {
        assert!(!v2_capped("max 100000\n"));
        assert!(v2_capped("25000 100000\n"));
        assert!(!v1_capped("-1\n"));
        assert!(v1_capped("2500\n"));
        assert_eq!(
            parse_cgroup_line("0::/kubepods/pod1/c1"),
            Some(("", "/kubepods/pod1/c1"))
        );
        assert_eq!(parse_cgroup_line("3:cpu,cpuacct:/a"), Some(("cpu,cpuacct", "/a")));
    }

    #[test]
    fn a_cap_on_a_parent_counts() {
        let root = std::env::temp_dir().join(format!("pf-cgroup-{}", std::process::id()));
        std::fs::create_dir_all(root.join("pod/c1")).unwrap();
        std::fs::write(root.join("pod/c1/cpu.max"), "max 100000\n").unwrap();
        assert!(!capped(&root, "/pod/c1", "cpu.max", v2_capped));
        std::fs::write(root.join("pod/cpu.max"), "50000 100000\n").unwrap();
        assert!(capped(&root, "/pod/c1", "cpu.max", v2_capped));
        std::fs::remove_dir_all(root).unwrap();
    }
}
