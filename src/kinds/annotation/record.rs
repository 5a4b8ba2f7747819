//! The leader record of the fourth lock kind: a ConfigMap whose annotation
//! `control-plane.alpha.kubernetes.io/leader` holds a JSON object, as
//! client-go's ConfigMapLock (up to v0.23), fabric8, the Java and the
//! official Python clients write it:
//!
//! ```text
//! client-go: {"holderIdentity":"pod-a","leaseDurationSeconds":15,"acquireTime":"2026-12-06T23:30:00Z","renewTime":"2026-12-06T23:30:02Z","leaderTransitions":3}
//! Python:    {"holderIdentity": "pod-a", "leaseDurationSeconds": "60", "acquireTime": "2026-12-06 23:30:00.123456", "renewTime": "2026-12-06 23:30:02.345678"}
//! fabric8:   {"holderIdentity":"pod-a","leaseDuration":"PT15S","acquireTime":"2026-12-06T23:30:00.000000Z","renewTime":"2026-12-06T23:30:02.000000Z","leaderTransitions":0}
//! ```
//!
//! This module is pure: it reads a record ([`parse`]) and writes the
//! released one ([`released`], [`is_released`]); no API calls.
//!
//! What [`parse`] settles, so that a lock the janitor cannot read for sure
//! is left alone (an error) rather than guessed at:
//!
//! - The value is read only up to [`MAX_LEN`] bytes: a longer one is an
//!   error, and is not parsed.
//! - `""` (and whitespace only) is a free record: the Python client writes
//!   it before its first record. `null`, an array, a string or a number is
//!   an error (no client writes them).
//! - `holderIdentity`: a string; `""`, `null` or absent is free (`None`),
//!   as every client takes it. Any other type is an error.
//! - `leaseDurationSeconds`: a JSON number, or a string of decimal digits
//!   (`"60"`, the Python client's `str()` of its setting), with an optional
//!   fraction (`60.0`, `"15.5"`): the Python client accepts a float
//!   `lease_duration` and writes `str()` of it, so a fraction is real input;
//!   it is rounded UP to whole seconds, which only makes the janitor wait
//!   longer than the holder's own lease. Zero, negative, more than one year
//!   ([`MAX_DURATION`]), an exponent (`"6e1"`), a sign, spaces, `NaN` or any
//!   other type is an error. `null` or absent is `None`.
//! - `leaseDuration` (fabric8, which never writes `leaseDurationSeconds`):
//!   the same rules, and also an ISO 8601 duration of hours, minutes and
//!   seconds in any case (`"PT15S"`, Java's `Duration`, as fabric8's mapper
//!   writes it since 6.x; 5.x wrote a number of seconds, `15.000000000`). A
//!   mapper that writes milliseconds (`15000`) is read as seconds: longer,
//!   never shorter. A record with both fields is judged by the longer.
//! - `renewTime`: a string. RFC 3339 with a zone (client-go, fabric8) gives
//!   [`Record::renewed`]; a date and time without a zone (the Python
//!   client's `str(datetime)`, local time on the holder's machine) gives
//!   `renewed: None`, as it is never trusted. Either way the string is kept
//!   as [`Record::renew_mark`]: the janitor judges a lock by seeing that
//!   mark change between its own reads, not by the holder's clock. A string
//!   that is not a date and time at all, or another type, is an error;
//!   `""`, `null` or absent is `None`.
//! - `acquireTime`, `leaderTransitions` (a number or a string) and any
//!   unknown field are not read here: they are ignored and [`released`]
//!   keeps them as they are.
//! - A key that spells `holderIdentity`, `leaseDurationSeconds`,
//!   `leaseDuration` or `renewTime` in another case (`HolderIdentity`) is an error: Go's
//!   `encoding/json` matches field names ignoring case, so a client-go
//!   holder would read it as the field while a strict reader would not.
//!   One of these four written twice is an error as well.

mod json;

use k8s_openapi::jiff::{civil, SignedDuration, Timestamp};
use serde_json::Value;

use json::{compact_into, object};

/// The annotation that holds the leader record.
pub const ANNOTATION: &str = "control-plane.alpha.kubernetes.io/leader";

/// The longest value read, in bytes: a record is a few hundred; a longer
/// value is an error before any parsing (an annotation may hold 256 KiB).
pub const MAX_LEN: usize = 64 * 1024;

/// The longest lease accepted: one year. Electors lease for seconds to
/// minutes; more is a typo or garbage, and a lock judged by it would never
/// be freed anyway.
pub const MAX_DURATION: SignedDuration = SignedDuration::from_secs(365 * 24 * 60 * 60);

/// How much of a bad value an error quotes, in characters.
const QUOTE_MAX: usize = 80;

/// What every released record starts with: no holder. `null`, not `""`:
/// every client reads both as no holder, but the official Java client
/// takes a record at once only when its holder is `null` (its own release
/// writes none), and waits a whole lease from when it saw a `""`.
const RELEASED_HOLDER: &str = r#"{"holderIdentity":null"#;
/// What a released record of a writer that knows `leaseDurationSeconds`
/// starts with (no holder, one second); `,` or `}` follows.
const RELEASED_PREFIX: &str = r#"{"holderIdentity":null,"leaseDurationSeconds":1"#;

const HOLDER: &str = "holderIdentity";
const DURATION: &str = "leaseDurationSeconds";
/// fabric8's name for the duration: a Java `Duration`, which its Jackson
/// mapper writes as an ISO 8601 string (`"PT15S"`) or, configured so, as a
/// number of seconds (`15.000000000`).
const FABRIC8_DURATION: &str = "leaseDuration";
const RENEW: &str = "renewTime";
/// The fields read, in the order of `parse`'s slots.
const FIELDS: [&str; 4] = [HOLDER, DURATION, FABRIC8_DURATION, RENEW];

/// A leader record as it was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// holderIdentity; None when empty, null or absent (the lock is free).
    pub holder: Option<String>,
    /// leaseDurationSeconds, or fabric8's leaseDuration (the longer if
    /// both): a JSON number or a string of decimal digits ("60"), or for
    /// fabric8 an ISO 8601 duration ("PT15S"); a fraction is rounded up to
    /// whole seconds. None when absent or null.
    pub duration: Option<SignedDuration>,
    /// renewTime when it is RFC 3339 with a zone (client-go, fabric8); None
    /// when absent, or written without a zone (Python's str(datetime):
    /// local time, never trusted).
    pub renewed: Option<Timestamp>,
    /// renewTime exactly as written (any format): what the janitor compares
    /// between reads to see a renewal.
    pub renew_mark: Option<String>,
}

impl Record {
    /// A free record: no holder, nothing else known.
    const FREE: Record = Record {
        holder: None,
        duration: None,
        renewed: None,
        renew_mark: None,
    };
}

/// Why a leader record was not read (or not released). Each message names
/// the annotation's part at fault and quotes at most 80 characters of the
/// bad value.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum RecordError {
    #[error("the leader record (annotation {ANNOTATION}) is {len} bytes long; lock-janitor reads at most {MAX_LEN}")]
    TooLarge { len: usize },
    #[error("the leader record (annotation {ANNOTATION}) is not JSON ({why}): {value}")]
    NotJson { why: String, value: String },
    #[error("the leader record (annotation {ANNOTATION}) is {found}, not a JSON object: {value}")]
    NotAnObject { found: &'static str, value: String },
    #[error("the leader record (annotation {ANNOTATION}) has a bad {field}: {why}")]
    BadField { field: String, why: String },
    /// The record's other fields mention what the delete guard refuses in
    /// a released record (see [`is_released`]): releasing it would be
    /// refused, so it is not written.
    #[error("the leader record (annotation {ANNOTATION}) cannot be released: {why}")]
    Unreleasable { why: String },
}

/// At most [`QUOTE_MAX`] characters of `s` in double quotes, control
/// characters escaped (they never reach a terminal), saying how long the
/// rest was. Quotes inside are left as they are, so JSON reads as JSON.
fn quote(s: &str) -> String {
    let (shown, cut) = match s.char_indices().nth(QUOTE_MAX) {
        None => (s, false),
        Some((at, _)) => (&s[..at], true),
    };
    let mut out = String::with_capacity(shown.len() + 2);
    out.push('"');
    for c in shown.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out.push('"');
    if cut {
        out.push_str(&format!("... ({} bytes in all)", s.len()));
    }
    out
}

fn bad(field: &str, why: impl Into<String>) -> RecordError {
    RecordError::BadField {
        field: quote_key(field),
        why: why.into(),
    }
}

/// A field name as an error shows it: bare when it is a plain word, else
/// quoted and cut.
fn quote_key(key: &str) -> String {
    if !key.is_empty() && key.len() <= QUOTE_MAX && key.bytes().all(|b| b.is_ascii_alphanumeric()) {
        key.to_owned()
    } else {
        quote(key)
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Parses the annotation's value. "" (and whitespace only) is Ok(a free
/// record: all None). See the module's documentation for every rule.
pub fn parse(value: &str) -> Result<Record, RecordError> {
    let members = object(value)?;
    let Some(members) = members else {
        return Ok(Record::FREE);
    };
    let mut record = Record::FREE;
    let mut seen = [false; FIELDS.len()];
    // Each duration as written: a record with both is judged by the longer
    // (each reader takes its own, and the janitor waits out either).
    let mut durations = [None, None];
    for m in &members {
        let slot = match FIELDS.iter().position(|f| *f == m.key) {
            Some(i) => i,
            None => {
                if let Some(f) = FIELDS.iter().find(|f| folds_to(&m.key, f)) {
                    return Err(bad(
                        &m.key,
                        format!("it differs from {f} only in case, and a reader that matches names ignoring case (Go's) takes it for {f}; write {f}"),
                    ));
                }
                continue;
            }
        };
        if std::mem::replace(&mut seen[slot], true) {
            return Err(bad(&m.key, "it is written twice"));
        }
        let v: Value = serde_json::from_str(m.value).map_err(|e| bad(&m.key, e.to_string()))?;
        match slot {
            0 => record.holder = holder(&v)?,
            1 => durations[0] = duration(DURATION, &v)?,
            2 => durations[1] = duration(FABRIC8_DURATION, &v)?,
            _ => (record.renewed, record.renew_mark) = renew(&v)?,
        }
    }
    record.duration = durations.into_iter().flatten().max();
    Ok(record)
}

fn holder(v: &Value) -> Result<Option<String>, RecordError> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) if s.is_empty() => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        other => Err(bad(
            HOLDER,
            format!(
                "{} ({other}), not a string naming the holder",
                type_name(other)
            ),
        )),
    }
}

/// A duration in seconds: a JSON number, or a string of decimal digits;
/// for fabric8's field also an ISO 8601 string (`"PT15S"`).
fn duration(field: &str, v: &Value) -> Result<Option<SignedDuration>, RecordError> {
    let why_range = |shown: &str| {
        bad(
            field,
            format!("{shown} seconds; a lease lasts more than 0 seconds and at most one year ({} seconds)", MAX_DURATION.as_secs()),
        )
    };
    let secs: f64 = match v {
        Value::Null => return Ok(None),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                u as f64
            } else if let Some(i) = n.as_i64() {
                i as f64
            } else {
                n.as_f64().unwrap_or(f64::NAN)
            }
        }
        Value::String(s) if field == FABRIC8_DURATION && s.starts_with(['P', 'p']) => iso8601(s)
            .ok_or_else(|| {
                bad(
                    field,
                    format!("{} is not an ISO 8601 duration of hours, minutes and seconds (such as \"PT15S\")", quote(s)),
                )
            })?,
        Value::String(s) => decimal(s).ok_or_else(|| {
            bad(
                field,
                format!("{} is not a number of seconds (digits, and an optional fraction such as \"15.5\")", quote(s)),
            )
        })?,
        other => {
            return Err(bad(
                field,
                format!("{} ({}), not a number of seconds", type_name(other), quote(&other.to_string())),
            ))
        }
    };
    let shown = match v {
        Value::String(s) => quote(s),
        other => other.to_string(),
    };
    // Not finite, not positive, or longer than a year (also what keeps the
    // cast below in range).
    if !(secs > 0.0 && secs <= MAX_DURATION.as_secs() as f64) {
        return Err(why_range(&shown));
    }
    Ok(Some(SignedDuration::from_secs(secs.ceil() as i64)))
}

/// `s` as an ISO 8601 duration in seconds (`PT15S`, `PT1M30.5S`), as
/// Java's `Duration.toString()` writes one: `PT`, then hours, minutes and
/// seconds, no sign.
/// Letters in any case, as Java's `Duration.parse` reads them. A fraction
/// of a second counts as a whole one (the caller rounds up).
fn iso8601(s: &str) -> Option<f64> {
    if !s.get(..2).is_some_and(|p| p.eq_ignore_ascii_case("PT")) || s.contains('-') {
        return None;
    }
    let d: SignedDuration = s.to_ascii_uppercase().parse().ok()?;
    Some(d.as_secs() as f64 + f64::from(u8::from(d.subsec_nanos() > 0)))
}

/// `s` as a decimal number: digits, optionally `.` and more digits; no
/// sign, exponent or spaces.
fn decimal(s: &str) -> Option<f64> {
    let (whole, frac) = match s.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (s, None),
    };
    let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || frac.is_some_and(|f| !digits(f)) {
        return None;
    }
    s.parse().ok()
}

fn renew(v: &Value) -> Result<(Option<Timestamp>, Option<String>), RecordError> {
    let s = match v {
        Value::Null => return Ok((None, None)),
        Value::String(s) if s.is_empty() => return Ok((None, None)),
        Value::String(s) => s,
        other => {
            return Err(bad(
                RENEW,
                format!(
                    "{} ({}), not a date and time",
                    type_name(other),
                    quote(&other.to_string())
                ),
            ))
        }
    };
    if let Ok(t) = s.parse::<Timestamp>() {
        return Ok((Some(t), Some(s.clone())));
    }
    if s.parse::<civil::DateTime>().is_ok() {
        // A zone-less time: local to the holder's machine. Kept only as a
        // mark to compare.
        return Ok((None, Some(s.clone())));
    }
    Err(bad(
        RENEW,
        format!(
            "{} is not a date and time (RFC 3339, or \"YYYY-MM-DD HH:MM:SS\")",
            quote(s)
        ),
    ))
}

/// The released record: compact JSON that starts exactly with
/// `{"holderIdentity":null`, then `,"leaseDurationSeconds":1` unless the
/// record is fabric8's, then `,` or `}`; then every other top-level field
/// of the original object kept with its value unchanged. Err when `value`
/// does not parse as a JSON object.
///
/// A record is fabric8's when it has `leaseDuration` and names
/// `leaseDurationSeconds` nowhere (in any case, as the guard checks it): fabric8 reads its record with a strict mapper,
/// to which `leaseDurationSeconds` is an unknown field that makes the whole
/// record unreadable (its elector would then never take the lock), so its
/// release names no holder and nothing more (fabric8 takes a record with
/// no holder at once, as every elector does).
///
/// The other fields are copied as written, in their order (whitespace
/// outside strings dropped): numbers keep their digits and strings their
/// escapes, and a key written twice stays twice (what every reader made of
/// it before, it makes of it after). Every key that a reader could take
/// for `holderIdentity` or `leaseDurationSeconds` (Go matches them ignoring
/// case) is dropped. Err as well ([`RecordError::Unreleasable`]) when a
/// kept field mentions what [`is_released`] refuses: the delete guard
/// would refuse that write.
pub fn released(value: &str) -> Result<String, RecordError> {
    let members = object(value)?.ok_or_else(|| RecordError::NotAnObject {
        found: "empty",
        value: quote(value),
    })?;
    // As the guard tells it (it parses no JSON): `leasedurationseconds`
    // nowhere in the record, in any case.
    let fabric8 = members.iter().any(|m| m.key == FABRIC8_DURATION)
        && !fold(value).contains("leasedurationseconds");
    let prefix = if fabric8 {
        RELEASED_HOLDER
    } else {
        RELEASED_PREFIX
    };
    let mut out = String::with_capacity(value.len() + prefix.len());
    out.push_str(prefix);
    for m in members
        .iter()
        .filter(|m| !folds_to(&m.key, HOLDER) && !folds_to(&m.key, DURATION))
    {
        out.push(',');
        out.push_str(m.raw_key);
        out.push(':');
        compact_into(m.value, &mut out);
    }
    out.push('}');
    if out.len() > MAX_LEN {
        return Err(RecordError::Unreleasable {
            why: format!(
                "it would be {} bytes long; the delete guard admits at most {MAX_LEN}",
                out.len()
            ),
        });
    }
    if let Some(why) = refused_rest(&out[prefix.len()..]) {
        return Err(RecordError::Unreleasable { why });
    }
    Ok(out)
}

/// Whether a value is a released record as `released` writes it, of
/// either form (the prefix rule below, without what it asks of the record
/// released: see [`is_release_of`]).
pub fn is_released(value: &str) -> bool {
    value.len() <= MAX_LEN
        && (after_prefix(value, RELEASED_PREFIX) || after_prefix(value, RELEASED_HOLDER))
}

/// Whether the delete guard admits `new` as the release of the record
/// `old`: its rule, in Rust (the guard's CEL parses no JSON), used by
/// tests to say what the guard does.
///
/// `old` is held: not empty, and not released already (neither prefix
/// below, nor client-go's own release, whose holder is `""`). `new` is at
/// most [`MAX_LEN`] bytes and starts with `{"holderIdentity":null`, then
/// either `,"leaseDurationSeconds":1`, or nothing more when `old` is
/// fabric8's (it names `leasedurationseconds` nowhere, in any case) and
/// `new` keeps its `"leaseDuration":`; then `,` or `}`. The rest never
/// names either field again in any spelling a JSON reader takes for it:
/// neither `holderidentity` nor `leasedurationseconds` in any case (also
/// with `ſ` for `s`, which Go folds to `s`), and no `\u` escape of an
/// ASCII letter or of `ſ`. So a record that names a holder after the
/// prefix (`...:null,"leaseDurationSeconds":1,"holderIdentity":"pod-b"}`,
/// where the last key wins) is not a release. Whether the rest is valid
/// JSON is not checked (CEL parses none). The guard counts the 64 KiB in
/// characters, this in bytes: it admits at least what this accepts.
pub fn is_release_of(old: &str, new: &str) -> bool {
    let held = !old.is_empty() && !was_released(old);
    let fabric8 = !fold(old).contains("leasedurationseconds");
    held && new.len() <= MAX_LEN
        && (after_prefix(new, RELEASED_PREFIX)
            || (fabric8
                && new.contains(r#""leaseDuration":"#)
                && after_prefix(new, RELEASED_HOLDER)))
}

/// `value` starts with `prefix`, then `,` or `}`, and the rest is one the
/// guard admits.
fn after_prefix(value: &str, prefix: &str) -> bool {
    value.strip_prefix(prefix).is_some_and(|rest| {
        (rest.starts_with(',') || rest.starts_with('}')) && refused_rest(rest).is_none()
    })
}

/// A record released already, as the guard tells one: it starts with no
/// holder (`""` or `null`), then `,` or `}`.
fn was_released(old: &str) -> bool {
    [r#"{"holderIdentity":"""#, RELEASED_HOLDER]
        .iter()
        .any(|prefix| {
            old.strip_prefix(prefix)
                .is_some_and(|rest| rest.starts_with(',') || rest.starts_with('}'))
        })
}

/// What in the part of a released record after its prefix the delete guard
/// refuses, if anything.
fn refused_rest(rest: &str) -> Option<String> {
    let folded = fold(rest);
    for word in ["holderidentity", "leasedurationseconds"] {
        if folded.contains(word) {
            return Some(format!("its other fields mention {word:?}"));
        }
    }
    // `\u` then 4 hex digits: 0040-007F (ASCII letters among them) or
    // 017F (`ſ`).
    let b = folded.as_bytes();
    for i in 0..b.len() {
        if b[i] == b'\\' && b.get(i + 1) == Some(&b'u') {
            let hex = b.get(i + 2..i + 6).unwrap_or_default();
            let letter = hex.len() == 4
                && ((hex[0] == b'0' && hex[1] == b'0' && (b'4'..=b'7').contains(&hex[2]))
                    || hex == b"017f");
            if letter {
                return Some(format!(
                    "its other fields write a letter as a \\u escape ({})",
                    String::from_utf8_lossy(&b[i..(i + 6).min(b.len())])
                ));
            }
        }
    }
    None
}

/// `s` with ASCII letters in lower case, and the two non-ASCII letters Go's
/// (and RE2's) case folding takes for ASCII ones replaced by them:
/// `ſ` (U+017F) by `s`, the Kelvin sign (U+212A) by `k`.
fn fold(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '\u{017F}' => 's',
            '\u{212A}' => 'k',
            c => c.to_ascii_lowercase(),
        })
        .collect()
}

/// Whether a reader that matches field names ignoring case (Go's
/// `encoding/json`) takes `key` for `field`.
fn folds_to(key: &str, field: &str) -> bool {
    fold(key) == fold(field)
}

#[cfg(test)]
mod tests;
