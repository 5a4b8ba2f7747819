//! The opt-in label selector: parsed once (kube has no parser for the
//! text form), matched client-side with kube's own [`Expression`] and
//! [`SelectorExt`] (the API server's semantics), and the one `key=value`
//! that `label` and the label carry-over write.

use std::collections::BTreeMap;
use std::fmt;

use kube::core::{Expression, SelectorExt as _};

/// An equality-based label selector (`key=value`, `key==value`,
/// `key!=value`, `key`, `!key`, comma-separated). The API server has the
/// last word; parsing catches typos before any watch starts. Set-based
/// terms (`in`, `notin`, `>`, `<`) are refused, and said to be: the opt-in
/// is a single value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selector {
    text: String,
    terms: Vec<Expression>,
}

impl Selector {
    pub fn parse(s: &str) -> Result<Selector, String> {
        let bad = |why: &str| Err(format!("invalid label selector {s:?}: {why}"));
        if s.trim().is_empty() {
            return bad("it is empty, which would select every ConfigMap");
        }
        if set_based(s) {
            return bad(
                "set-based selectors (`key in (a,b)`, `key notin (a,b)`, `key>1`) are not supported: \
                 give one key=value term, such as lock-janitor.io/watch=true \
                 (other comma-separated terms may narrow it: key=value, key!=value, key, !key)",
            );
        }
        let mut terms = Vec::new();
        for term in s.split(',') {
            let term = term.trim();
            let (key, t) = if let Some(k) = term.strip_prefix('!') {
                if k.contains('=') {
                    return bad(&format!(
                        "{term:?}: `!key` takes no value; write key!=value to exclude one value"
                    ));
                }
                (k.trim(), Expression::DoesNotExist(k.trim().to_owned()))
            } else if let Some((k, v, eq)) = term
                .split_once("!=")
                .map(|(k, v)| (k, v, false))
                .or_else(|| term.split_once("==").map(|(k, v)| (k, v, true)))
                .or_else(|| term.split_once('=').map(|(k, v)| (k, v, true)))
            {
                let (k, v) = (k.trim(), v.trim());
                if !valid_label_value(v) {
                    return bad(&format!("{v:?} is not a label value"));
                }
                let op = if eq {
                    Expression::Equal
                } else {
                    Expression::NotEqual
                };
                (k, op(k.to_owned(), v.to_owned()))
            } else {
                (term, Expression::Exists(term.to_owned()))
            };
            if !valid_label_key(key) {
                return bad(&format!("{key:?} is not a label key"));
            }
            terms.push(t);
        }
        Ok(Selector {
            text: s.to_owned(),
            terms,
        })
    }

    /// The selector as given, for the API server.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        static NONE: BTreeMap<String, String> = BTreeMap::new();
        let labels = labels.unwrap_or(&NONE);
        self.terms.iter().all(|t| t.matches(labels))
    }

    /// `run` manages only locks that opted in: the selector must hold a
    /// `key=value` term (the label `label` and the carry-over write). Other
    /// terms are ANDed with it, so they can only narrow. `k`, `!k` or `k!=v`
    /// alone would select locks labeled `k=false` (the documented opt-out)
    /// or every ConfigMap without `k`.
    pub fn require_opt_in(&self) -> Result<(), String> {
        if self
            .terms
            .iter()
            .any(|t| matches!(t, Expression::Equal(..)))
        {
            return Ok(());
        }
        Err(format!(
            "--selector {:?} does not require an opt-in label: `run` needs a key=value term \
             (for example {}); `key`, `!key` and `key!=value` alone select locks that opted out \
             (key=false) or never opted in. Extra terms may narrow it, as in {},team=payments",
            self.text,
            crate::DEFAULT_SELECTOR,
            crate::DEFAULT_SELECTOR
        ))
    }

    /// The label that opts a lock in, when the selector is exactly one
    /// `key=value`: what `label` and the carry-over after a takeover write.
    pub fn opt_in_label(&self) -> Option<(&str, &str)> {
        match self.terms.as_slice() {
            [Expression::Equal(k, v)] => Some((k, v)),
            _ => None,
        }
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Does `s` use the set-based grammar (`in`, `notin`, `(...)`, `>`, `<`),
/// which the equality-based parser would misread as an odd label key?
fn set_based(s: &str) -> bool {
    s.contains(['(', ')', '<', '>'])
        || s.split(',').any(|term| {
            term.split_whitespace()
                .nth(1)
                .is_some_and(|op| op == "in" || op == "notin")
        })
}

fn valid_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn valid_label_key(k: &str) -> bool {
    match k.split_once('/') {
        Some((prefix, name)) => {
            !prefix.is_empty()
                && prefix.len() <= 253
                && prefix.split('.').all(|p| {
                    !p.is_empty()
                        && p.bytes()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
                })
                && valid_name_part(name)
        }
        None => valid_name_part(k),
    }
}

fn valid_label_value(v: &str) -> bool {
    v.is_empty() || valid_name_part(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn grammar() {
        for ok in [
            "lock-janitor.io/watch=true",
            "a==b",
            "a!=b",
            "team",
            "!legacy",
            "lock-janitor.io/watch=true,team=x",
            "a=",
        ] {
            assert!(Selector::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "  ",
            "=x",
            "a=b c",
            "lock-janitor.io/=true",
            "a=-b",
            "/x=1",
            "a=b,",
            "a in (b)",
        ] {
            assert!(Selector::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn set_based_selectors_are_named_as_such() {
        for set in [
            "lock-janitor.io/watch in (true,yes)",
            "lock-janitor.io/watch notin (false)",
            "env in (prod)",
            "lock-janitor.io/watch=true,tier notin (dev)",
            "a in b",
            "replicas>1",
        ] {
            let err = Selector::parse(set).unwrap_err();
            assert!(
                err.contains("set-based selectors") && err.contains("one key=value term"),
                "{set}: {err}"
            );
            assert!(!err.contains("not a label key"), "{set}: {err}");
        }
        let err = Selector::parse("!lock-janitor.io/watch=true").unwrap_err();
        assert!(err.contains("`!key` takes no value"), "{err}");
        // Not set-based: a key merely containing the letters.
        assert!(Selector::parse("inbox=1,team=in").is_ok());
    }

    #[test]
    fn opt_in_label_is_the_single_equality() {
        let one = |s: &str| Selector::parse(s).unwrap();
        assert_eq!(
            one("lock-janitor.io/watch=true").opt_in_label(),
            Some(("lock-janitor.io/watch", "true"))
        );
        assert_eq!(one("a==b").opt_in_label(), Some(("a", "b")));
        assert_eq!(one("a!=b").opt_in_label(), None);
        assert_eq!(one("a=b,c=d").opt_in_label(), None);
        assert_eq!(one("a").opt_in_label(), None);
        assert_eq!(one("a=b").as_str(), "a=b");
    }

    #[test]
    fn run_requires_an_opt_in_term() {
        for ok in [
            "lock-janitor.io/watch=true",
            "a==b",
            "lock-janitor.io/watch=true,team=x",
            "lock-janitor.io/watch=true,!legacy",
            "lock-janitor.io/watch=true,tier!=dev",
        ] {
            assert!(
                Selector::parse(ok).unwrap().require_opt_in().is_ok(),
                "{ok}"
            );
        }
        for bad in [
            "lock-janitor.io/watch",
            "!foo",
            "lock-janitor.io/watch!=false",
            "team,!legacy",
        ] {
            let err = Selector::parse(bad).unwrap().require_opt_in().unwrap_err();
            assert!(err.contains("key=value"), "{bad}: {err}");
        }
    }

    #[test]
    fn matches_like_the_api_server() {
        let watch = labels(&[("lock-janitor.io/watch", "true"), ("team", "a")]);
        let off = labels(&[("lock-janitor.io/watch", "false")]);
        let none = BTreeMap::new();
        let cases = [
            ("lock-janitor.io/watch=true", [true, false, false]),
            ("lock-janitor.io/watch==true", [true, false, false]),
            ("lock-janitor.io/watch!=true", [false, true, true]),
            ("lock-janitor.io/watch", [true, true, false]),
            ("!lock-janitor.io/watch", [false, false, true]),
            ("lock-janitor.io/watch=true,team=a", [true, false, false]),
            ("lock-janitor.io/watch=true, team=b", [false, false, false]),
            ("team=", [false, false, false]),
        ];
        for (sel, want) in cases {
            let s = Selector::parse(sel).unwrap();
            let got = [
                s.matches(Some(&watch)),
                s.matches(Some(&off)),
                s.matches(Some(&none)),
            ];
            assert_eq!(got, want, "{sel}");
            assert_eq!(s.matches(None), want[2], "{sel} without labels");
        }
        let empty_value = Selector::parse("team=").unwrap();
        assert!(empty_value.matches(Some(&labels(&[("team", "")]))));
    }
}
