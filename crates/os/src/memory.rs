//! What the host offers for rows kept in memory: transparent huge pages, and the memory
//! still available. Read from /sys and /proc (Linux); absent elsewhere.

/// The transparent-huge-page mode as the kernel names it (`always`, `madvise` or `never`),
/// or `None` where the host does not say.
pub fn transparent_huge_pages() -> Option<String> {
    let text = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    thp_mode(&text)
}

/// The bracketed word of `always [madvise] never`.
fn thp_mode(text: &str) -> Option<String> {
    let open = text.find('[')?;
    let close = open + text[open..].find(']')?;
    Some(text[open + 1..close].to_string())
}

/// The host's memory in bytes: (available to new allocations without swapping, total),
/// from /proc/meminfo's `MemAvailable` and `MemTotal`.
pub fn memory_available() -> Option<(u64, u64)> {
    meminfo(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

fn meminfo(text: &str) -> Option<(u64, u64)> {
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let kb: u64 = line[name.len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kb * 1024)
    };
    Some((field("MemAvailable:")?, field("MemTotal:")?))
}

/// Why `bytes` more in 2 MiB pages would not be wise here, or `None` when it would: huge
/// pages off (or unknown), or the copy leaving less than a tenth of the host's memory (at
/// least 4 GiB) available.
pub fn huge_copy_refused(bytes: u64) -> Option<String> {
    match transparent_huge_pages().as_deref() {
        Some("always") | Some("madvise") => {}
        Some(mode) => return Some(format!("transparent huge pages are '{mode}' on this host")),
        None => return Some("this host does not say whether it has transparent huge pages".into()),
    }
    let Some((available, total)) = memory_available() else {
        return Some("this host does not say how much memory is available".into());
    };
    refused_for_room(bytes, available, total)
}

fn refused_for_room(bytes: u64, available: u64, total: u64) -> Option<String> {
    let keep = (total / 10).max(4 << 30);
    (bytes.saturating_add(keep) > available).then(|| {
        format!(
            "a copy of {:.1} GB would leave less than {:.1} GB of the {:.1} GB available",
            bytes as f64 / 1e9,
            keep as f64 / 1e9,
            available as f64 / 1e9
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_mode_and_the_memory() {
        assert_eq!(thp_mode("always [madvise] never\n").as_deref(), Some("madvise"));
        assert_eq!(thp_mode("[never]").as_deref(), Some("never"));
        assert_eq!(thp_mode("nothing"), None);
        let text = "MemTotal:       16384 kB\nMemFree: 1 kB\nMemAvailable:    8192 kB\n";
        assert_eq!(meminfo(text), Some((8192 * 1024, 16384 * 1024)));
        assert_eq!(meminfo("MemTotal: 5 kB\n"), None);
    }

    #[test]
    fn keeps_a_tenth_and_at_least_4_gib() {
        let gib = 1u64 << 30;
        assert_eq!(refused_for_room(10 * gib, 20 * gib, 32 * gib), None);
        let e = refused_for_room(17 * gib, 20 * gib, 32 * gib).unwrap();
        assert!(e.contains("18.3 GB") && e.contains("4.3 GB"), "{e}");
        // a tenth of 128 GiB is more than 4 GiB
        assert!(refused_for_room(60 * gib, 70 * gib, 128 * gib).is_some());
        assert_eq!(refused_for_room(52 * gib, 70 * gib, 128 * gib), None);
    }
}
