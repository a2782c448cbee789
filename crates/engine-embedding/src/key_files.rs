//! The store's key files, as the model's parameters name them: where its caches save the
//! keys they hold (`cache_state_dir`) and the keys pinned caches hold (`gpucache_pinned_keys`).

use std::path::Path;

use triton_rust_core::error::{Error, Result};
use triton_rust_embedding::{CacheEviction, CacheState};

/// The file of keys pinned caches hold (`gpucache_pinned_keys`, relative to the version
/// directory): required by `gpucache_policy: pinned` and refused by every other policy, and
/// beside a cache state (`state`: pinned caches learn nothing to save).
pub(crate) fn pinned_keys(
    policy: CacheEviction,
    file: Option<&str>,
    state: Option<&CacheState>,
    version_dir: &Path,
) -> Result<Option<std::path::PathBuf>> {
    let pinned = policy == CacheEviction::Pinned;
    let file = file.map(str::trim).filter(|f| !f.is_empty());
    match (pinned, file) {
        (true, None) => Err(Error::invalid_arg(
            "gpucache_policy pinned holds the keys of a file: set parameter 'gpucache_pinned_keys' (a cache state file, as a store's cache_state_dir holds)",
        )),
        (true, Some(_)) if state.is_some() => Err(Error::invalid_arg(
            "gpucache_policy pinned caches never change, so they have nothing to save in cache_state_dir: set one or the other",
        )),
        (false, Some(f)) => Err(Error::invalid_arg(format!(
            "parameter 'gpucache_pinned_keys' = '{f}' is read only by gpucache_policy pinned; the policy is {}",
            policy.name()
        ))),
        (true, Some(f)) => Ok(Some(version_dir.join(f))),
        (false, None) => Ok(None),
    }
}

/// Where the caches save their keys (`cache_state_dir`, relative to the version directory)
/// and how often (`cache_state_period_s`), `None` without a directory.
pub(crate) fn cache_state(
    dir: Option<&str>,
    period_s: f64,
    name: &str,
    version_dir: &Path,
) -> Result<Option<CacheState>> {
    let Some(dir) = dir else { return Ok(None) };
    if dir == "none" {
        return Ok(None);
    }
    if !(period_s.is_finite() && period_s >= 0.0) {
        return Err(Error::invalid_arg(format!(
            "parameter 'cache_state_period_s' is the seconds between saves of the caches' keys, 0 or more (0: at unload only); got {period_s}"
        )));
    }
    Ok(Some(CacheState { store: name.to_string(), dir: version_dir.join(dir), period_s }))
}
