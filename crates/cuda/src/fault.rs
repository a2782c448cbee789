//! GPUs that hit an unrecoverable CUDA error (a device-side assert, an illegal address). The
//! error is sticky for the process's whole context on that device, so it is the process's
//! state, kept here with the rest of what this crate knows of the devices: every model on such
//! a GPU is then refused clearly instead of failing in confusing ways. No driver needed.

use std::sync::Mutex;

static FAULTS: Mutex<Vec<(i32, String)>> = Mutex::new(Vec::new());

/// Records `reason` as GPU `device`'s fault; false when one was recorded already (the first
/// stands).
pub fn note_fault(device: i32, reason: String) -> bool {
    let Ok(mut faults) = FAULTS.lock() else { return false };
    if faults.iter().any(|f| f.0 == device) {
        return false;
    }
    faults.push((device, reason));
    true
}

/// GPU `device`'s recorded fault, if any.
pub fn fault_of(device: i32) -> Option<String> {
    FAULTS.lock().ok()?.iter().find(|f| f.0 == device).map(|f| f.1.clone())
}

/// Whether GPU `device` has a fault recorded.
pub fn has_fault(device: i32) -> bool {
    fault_of(device).is_some()
}
