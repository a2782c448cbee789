//! A caught panic's payload as text (`panic!` gives a `&str` or a `String`).

use std::any::Any;

/// The panic's message, or a placeholder for a payload that is not text.
pub fn panic_text(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "<non-text panic payload>".into())
}

#[cfg(test)]
mod tests {
    use super::panic_text;

    #[test]
    fn text_of_each_payload_kind() {
        let caught = |f: fn()| std::panic::catch_unwind(f).unwrap_err();
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        assert_eq!(panic_text(&*caught(|| panic!("plain"))), "plain");
        assert_eq!(panic_text(&*caught(|| panic!("formatted {}", 7))), "formatted 7");
        assert_eq!(panic_text(&*caught(|| std::panic::panic_any(7u8))), "<non-text panic payload>");
        std::panic::set_hook(hook);
    }
}
