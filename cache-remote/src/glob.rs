//! Key patterns for listing a store (`Remote::scan`): a glob where only `*` is special, and it
//! matches any run of characters.

/// Whether `text` matches `pattern`.
pub(crate) fn matches(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if text.len() < first.len() + last.len() || !text.starts_with(first) || !text.ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_runs_of_characters() {
        assert!(matches("tc1:a:*:m:f", "tc1:a:0123:m:f"));
        assert!(!matches("tc1:a:*:m:f", "tc1:a:0123:m:g"));
        assert!(matches("exact", "exact") && !matches("exact", "exactly"));
        assert!(matches("a*", "a") && matches("*", "") && !matches("ab*ba", "aba"));
        assert!(matches("a*b*c", "axxbyyc") && !matches("a*b*c", "axxcyyb"));
    }
}
