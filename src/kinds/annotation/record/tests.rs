use super::*;

/// The Python client's record, byte for byte as `json.dumps` writes it.
const PYTHON: &str = r#"{"holderIdentity": "pod-a", "leaseDurationSeconds": "60", "acquireTime": "2026-12-06 23:30:00.123456", "renewTime": "2026-12-06 23:30:02.345678"}"#;
/// client-go's ConfigMapLock record.
const CLIENT_GO: &str = r#"{"holderIdentity":"pod-a_4f0c","leaseDurationSeconds":15,"acquireTime":"2026-12-06T23:30:00Z","renewTime":"2026-12-06T23:30:02.5+01:00","leaderTransitions":3}"#;

/// fabric8's ConfigMapLock record: `leaseDuration`, a Java `Duration` its
/// mapper writes in ISO 8601, and times to the microsecond in UTC.
const FABRIC8: &str = r#"{"holderIdentity":"pod-a","leaseDuration":"PT15S","acquireTime":"2026-12-06T23:30:00.000000Z","renewTime":"2026-12-06T23:30:02.123456Z","leaderTransitions":0}"#;

fn secs(s: i64) -> Option<SignedDuration> {
    Some(SignedDuration::from_secs(s))
}

fn field_err(value: &str) -> String {
    match parse(value) {
        Err(RecordError::BadField { field, why }) => format!("{field}: {why}"),
        other => panic!("{value}: expected a bad field, got {other:?}"),
    }
}

fn obj(value: &str) -> serde_json::Map<String, Value> {
    match serde_json::from_str(value) {
        Ok(Value::Object(m)) => m,
        other => panic!("{value}: not an object: {other:?}"),
    }
}

#[test]
fn python_record_verbatim_is_read_and_its_zoneless_time_is_only_a_mark() {
    let r = parse(PYTHON).unwrap();
    assert_eq!(
        r,
        Record {
            holder: Some("pod-a".into()),
            duration: secs(60),
            renewed: None,
            renew_mark: Some("2026-12-06 23:30:02.345678".into()),
        }
    );
    // str(datetime) of a whole second has no fraction.
    let r = parse(r#"{"holderIdentity": "pod-a", "leaseDurationSeconds": "60", "renewTime": "2026-12-06 23:30:02"}"#).unwrap();
    assert_eq!(
        (r.renewed, r.renew_mark.as_deref()),
        (None, Some("2026-12-06 23:30:02"))
    );
}

#[test]
fn client_go_record_is_read_with_its_zoned_time() {
    let r = parse(CLIENT_GO).unwrap();
    assert_eq!(r.holder.as_deref(), Some("pod-a_4f0c"));
    assert_eq!(r.duration, secs(15));
    assert_eq!(r.renewed, Some("2026-12-06T22:30:02.5Z".parse().unwrap()));
    assert_eq!(r.renew_mark.as_deref(), Some("2026-12-06T23:30:02.5+01:00"));
}

#[test]
fn empty_whitespace_and_empty_object_are_free() {
    let free = Record {
        holder: None,
        duration: None,
        renewed: None,
        renew_mark: None,
    };
    for v in ["", "  \n\t", "{}", " { } "] {
        assert_eq!(parse(v), Ok(free.clone()), "{v:?}");
    }
}

#[test]
fn null_and_empty_fields_are_none() {
    let r = parse(r#"{"holderIdentity":null,"leaseDurationSeconds":null,"acquireTime":null,"renewTime":null}"#).unwrap();
    assert_eq!(
        r,
        Record {
            holder: None,
            duration: None,
            renewed: None,
            renew_mark: None
        }
    );
    let r = parse(r#"{"holderIdentity":"","leaseDurationSeconds":1,"renewTime":""}"#).unwrap();
    assert_eq!((r.holder, r.duration, r.renew_mark), (None, secs(1), None));
}

#[test]
fn bad_json_is_an_error_that_quotes_at_most_80_characters() {
    match parse(r#"{"holderIdentity": "pod-a""#) {
        Err(e @ RecordError::NotJson { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains(ANNOTATION) && msg.contains("not JSON"),
                "{msg}"
            );
        }
        other => panic!("{other:?}"),
    }
    let long = format!("{{\"holderIdentity\": \"{}", "x".repeat(1000));
    let msg = parse(&long).unwrap_err().to_string();
    assert!(msg.len() < 300, "{msg}");
    assert!(msg.contains("bytes in all"), "{msg}");
    let msg = parse("{\"a\":\"\u{1b}[2J\"").unwrap_err().to_string();
    assert!(!msg.contains('\u{1b}') && msg.contains("\\u{1b}"), "{msg}");
    // Python's own non-JSON constants are not JSON.
    assert!(matches!(
        parse(r#"{"leaseDurationSeconds": NaN}"#),
        Err(RecordError::NotJson { .. })
    ));
}

#[test]
fn a_value_that_is_not_an_object_is_an_error() {
    for (v, found) in [
        ("[1,2]", "an array"),
        ("null", "null"),
        ("\"pod-a\"", "a string"),
        ("60", "a number"),
        ("true", "a boolean"),
    ] {
        match parse(v) {
            Err(RecordError::NotAnObject { found: f, .. }) => assert_eq!(f, found, "{v}"),
            other => panic!("{v}: {other:?}"),
        }
        assert!(released(v).is_err(), "{v}");
    }
}

#[test]
fn a_huge_value_is_an_error_without_parsing() {
    let huge = format!(
        "{{\"holderIdentity\":\"pod-a\",\"x\":\"{}\"}}",
        "y".repeat(MAX_LEN)
    );
    assert_eq!(parse(&huge), Err(RecordError::TooLarge { len: huge.len() }));
    assert_eq!(
        released(&huge),
        Err(RecordError::TooLarge { len: huge.len() })
    );
    // Not even JSON: still TooLarge, so it was never parsed.
    let junk = "[".repeat(MAX_LEN + 1);
    assert!(matches!(parse(&junk), Err(RecordError::TooLarge { .. })));
    // Deep nesting under the limit is a plain error (serde_json's depth limit).
    let deep = format!("{{\"x\":{}{}}}", "[".repeat(5000), "]".repeat(5000));
    assert!(matches!(parse(&deep), Err(RecordError::NotJson { .. })));
}

#[test]
fn durations_as_numbers_or_strings_fractions_rounded_up() {
    let d = |v: &str| parse(&format!(r#"{{"leaseDurationSeconds":{v}}}"#)).map(|r| r.duration);
    assert_eq!(d("15"), Ok(secs(15)));
    assert_eq!(d(r#""60""#), Ok(secs(60)));
    assert_eq!(d("60.0"), Ok(secs(60)));
    assert_eq!(d(r#""15.5""#), Ok(secs(16)));
    assert_eq!(d("0.25"), Ok(secs(1)));
    assert_eq!(d("31536000"), Ok(secs(31_536_000)));
}

#[test]
fn bad_durations_are_errors() {
    for v in [
        "0",
        "-5",
        r#""-5""#,
        r#""0""#,
        "31536001",
        r#""31536001""#,
        "18446744073709551616",
        r#""6e1""#,
        r#""""#,
        "1e308",
        r#"" 60""#,
        r#""60s""#,
        r#""+60""#,
        r#""60.""#,
        r#"".5""#,
        r#""NaN""#,
        "true",
        "[60]",
        r#"{"s":60}"#,
    ] {
        let why = field_err(&format!(
            r#"{{"holderIdentity":"a","leaseDurationSeconds":{v}}}"#
        ));
        assert!(why.starts_with("leaseDurationSeconds: "), "{v}: {why}");
    }
    let why = field_err(r#"{"leaseDurationSeconds":-5}"#);
    assert!(
        why.contains("-5 seconds") && why.contains("at most one year"),
        "{why}"
    );
    // Beyond f64: serde_json calls it no JSON at all.
    assert!(matches!(
        parse(r#"{"leaseDurationSeconds":1e400}"#),
        Err(RecordError::NotJson { .. })
    ));
}

#[test]
fn holder_that_is_not_a_string_is_an_error() {
    for v in ["5", "true", "[\"pod-a\"]", "{\"name\":\"pod-a\"}"] {
        let why = field_err(&format!(r#"{{"holderIdentity":{v}}}"#));
        assert!(
            why.starts_with("holderIdentity: ") && why.contains("not a string"),
            "{v}: {why}"
        );
    }
    assert_eq!(
        parse(r#"{"holderIdentity":" "}"#)
            .unwrap()
            .holder
            .as_deref(),
        Some(" ")
    );
}

#[test]
fn times_with_and_without_zone() {
    let t = |v: &str| parse(&format!(r#"{{"renewTime":{v}}}"#)).map(|r| (r.renewed, r.renew_mark));
    let zoned: Timestamp = "2026-12-06T23:30:02Z".parse().unwrap();
    assert_eq!(
        t(r#""2026-12-06T23:30:02Z""#),
        Ok((Some(zoned), Some("2026-12-06T23:30:02Z".into())))
    );
    assert_eq!(t(r#""2026-12-07T00:30:02+01:00""#).unwrap().0, Some(zoned));
    assert_eq!(
        t(r#""2026-12-06T23:30:02.000000Z""#).unwrap().0,
        Some(zoned)
    );
    // Without a zone: never trusted, still a mark.
    for v in [
        "2026-12-06 23:30:02.345678",
        "2026-12-06T23:30:02",
        "2026-12-06 23:30:02",
    ] {
        assert_eq!(t(&format!("{v:?}")), Ok((None, Some(v.to_owned()))), "{v}");
    }
    for v in [
        r#""yesterday""#,
        r#""2026-13-06 23:30:02""#,
        "1765063802",
        "true",
    ] {
        let why = field_err(&format!(r#"{{"renewTime":{v}}}"#));
        assert!(
            why.starts_with("renewTime: ") && why.contains("not a date and time"),
            "{v}: {why}"
        );
    }
}

#[test]
fn unknown_fields_and_leader_transitions_are_ignored() {
    for v in [
        r#"{"holderIdentity":"a","leaderTransitions":3}"#,
        r#"{"holderIdentity":"a","leaderTransitions":"3"}"#,
        r#"{"holderIdentity":"a","extra":{"nested":[1,2,{"x":null}]},"acquireTime":42}"#,
    ] {
        assert_eq!(parse(v).unwrap().holder.as_deref(), Some("a"), "{v}");
    }
}

#[test]
fn a_field_in_another_case_or_written_twice_is_an_error() {
    let why = field_err(r#"{"holderIdentity":"","HolderIdentity":"pod-b"}"#);
    assert!(
        why.starts_with("HolderIdentity: ") && why.contains("only in case"),
        "{why}"
    );
    let why = field_err(r#"{"leaseDurationSecondſ":60}"#);
    assert!(why.contains("only in case"), "{why}");
    let why = field_err(r#"{"holderIdentity":"pod-a","holderIdentity":"pod-b"}"#);
    assert!(why.contains("written twice"), "{why}");
    // An escaped spelling is the same key.
    let why = field_err(r#"{"holderIdentity":"pod-a","holder\u0049dentity":"pod-b"}"#);
    assert!(why.contains("written twice"), "{why}");
}

#[test]
fn released_starts_with_the_prefix_and_keeps_every_other_field() {
    let out = released(CLIENT_GO).unwrap();
    assert_eq!(
        out,
        r#"{"holderIdentity":null,"leaseDurationSeconds":1,"acquireTime":"2026-12-06T23:30:00Z","renewTime":"2026-12-06T23:30:02.5+01:00","leaderTransitions":3}"#
    );
    // Values unchanged to the byte, also what a float would change.
    let odd = r#"{ "a" : 1.50e2 , "holderIdentity" : "x", "n": 123456789012345678901234567890, "s": "\u00e9 \"q\"", "o": { "k" : [ 1 , 2 ] } }"#;
    assert_eq!(
        released(odd).unwrap(),
        r#"{"holderIdentity":null,"leaseDurationSeconds":1,"a":1.50e2,"n":123456789012345678901234567890,"s":"\u00e9 \"q\"","o":{"k":[1,2]}}"#
    );
    assert_eq!(
        released("{}").unwrap(),
        r#"{"holderIdentity":null,"leaseDurationSeconds":1}"#
    );
    assert!(released("").is_err());
    assert!(released("{").is_err());
}

#[test]
fn released_python_record_reads_back_free_with_one_second() {
    let out = released(PYTHON).unwrap();
    assert!(
        out.starts_with(r#"{"holderIdentity":null,"leaseDurationSeconds":1,"#),
        "{out}"
    );
    let r = parse(&out).unwrap();
    assert_eq!((r.holder, r.duration), (None, secs(1)));
    assert_eq!(r.renew_mark.as_deref(), Some("2026-12-06 23:30:02.345678"));
    let (mut before, after) = (obj(PYTHON), obj(&out));
    before.insert(HOLDER.into(), Value::Null);
    before.insert(DURATION.into(), Value::from(1));
    assert_eq!(before, after);
    assert!(is_released(&out));
}

#[test]
fn released_drops_every_spelling_of_the_two_fields() {
    let out = released(
        r#"{"HOLDERIDENTITY":"pod-b","leaseDurationSecondſ":9,"holderIdentity":"a","x":1}"#,
    )
    .unwrap();
    assert_eq!(
        out,
        r#"{"holderIdentity":null,"leaseDurationSeconds":1,"x":1}"#
    );
    // What the guard would refuse is not written.
    for v in [
        r#"{"note":"holderIdentity was pod-a"}"#,
        r#"{"x":"\u0041"}"#,
    ] {
        assert!(
            matches!(released(v), Err(RecordError::Unreleasable { .. })),
            "{v}"
        );
    }
}

#[test]
fn is_released_is_the_prefix_rule() {
    for v in [
        r#"{"holderIdentity":null,"leaseDurationSeconds":1}"#,
        r#"{"holderIdentity":null,"leaseDurationSeconds":1,"renewTime":"2026-12-06 23:30:02"}"#,
    ] {
        assert!(is_released(v), "{v}");
    }
    for v in [
        "",
        PYTHON,
        CLIENT_GO,
        r#"{"holderIdentity":"pod-b","leaseDurationSeconds":1}"#,
        r#"{"holderIdentity":"","leaseDurationSeconds":1}"#,
        r#"{"holderIdentity":null}"#,
        r#"{"holderIdentity":null,"leaseDurationSeconds":10}"#,
        r#"{"holderIdentity":null,"leaseDurationSeconds":1.5}"#,
        r#"{"holderIdentity": "", "leaseDurationSeconds": 1}"#,
        r#"{"leaseDurationSeconds":1,"holderIdentity":""}"#,
        r#"{"holderIdentity":null,"leaseDurationSeconds":1"#,
        r#"{"holderIdentity":null,"leaseDurationSeconds":1,"holderIdentity":"pod-b"}"#,
        r#"{"holderIdentity":null,"leaseDurationSeconds":1,"HolderIdentity":"pod-b"}"#,
        r#"{"holderIdentity":null,"leaseDurationSeconds":1,"h\u006flderIdentity":"pod-b"}"#,
        r#"{"holderIdentity":null,"leaseDurationSeconds":1,"leaseDurationSecondſ":60}"#,
        r#"{"holderIdentity":null,"leaseDurationSeconds":1,"leaseDurationSecond\u017F":60}"#,
    ] {
        assert!(!is_released(v), "{v}");
    }
    let huge = format!(
        r#"{{"holderIdentity":null,"leaseDurationSeconds":1,"x":"{}"}}"#,
        "y".repeat(MAX_LEN)
    );
    assert!(!is_released(&huge));
}

#[test]
fn fabric8_record_is_read_with_its_iso_duration_and_zoned_time() {
    let r = parse(FABRIC8).unwrap();
    assert_eq!(
        r,
        Record {
            holder: Some("pod-a".into()),
            duration: secs(15),
            renewed: Some("2026-12-06T23:30:02.123456Z".parse().unwrap()),
            renew_mark: Some("2026-12-06T23:30:02.123456Z".into()),
        }
    );
    let d = |v: &str| parse(&format!(r#"{{"leaseDuration":{v}}}"#)).map(|r| r.duration);
    // A mapper that writes durations as numbers: seconds, nanoseconds after
    // the point.
    assert_eq!(d("15.000000000"), Ok(secs(15)));
    assert_eq!(d("15"), Ok(secs(15)));
    assert_eq!(d(r#""PT1M30.5S""#), Ok(secs(91)));
    assert_eq!(d(r#""PT2H""#), Ok(secs(7200)));
    assert_eq!(d(r#""pt15s""#), Ok(secs(15)));
    assert_eq!(d(r#""PT0.000000001S""#), Ok(secs(1)));
    assert_eq!(d(r#""60""#), Ok(secs(60)));
    // Both written: the longer, whichever it is.
    let both = |a: &str, b: &str| {
        parse(&format!(
            r#"{{"leaseDurationSeconds":{a},"leaseDuration":{b}}}"#
        ))
        .map(|r| r.duration)
    };
    assert_eq!(both("10", r#""PT15S""#), Ok(secs(15)));
    assert_eq!(both("60", r#""PT15S""#), Ok(secs(60)));
}

#[test]
fn bad_fabric8_durations_are_errors() {
    for v in [
        r#""PT0S""#,
        r#""PT-15S""#,
        r#""-PT15S""#,
        r#""P1D""#,
        r#""PT""#,
        r#""PTS""#,
        r#""15s""#,
        r#""PT15S ""#,
        r#""P""#,
        "0",
        "true",
    ] {
        let why = field_err(&format!(r#"{{"holderIdentity":"a","leaseDuration":{v}}}"#));
        assert!(why.starts_with("leaseDuration: "), "{v}: {why}");
    }
    let why = field_err(r#"{"holderIdentity":"a","LeaseDuration":"PT15S"}"#);
    assert!(why.contains("only in case"), "{why}");
    let why = field_err(r#"{"leaseDuration":"PT15S","leaseDuration":"PT1S"}"#);
    assert!(why.contains("written twice"), "{why}");
}

#[test]
fn fabric8_record_is_released_without_a_field_fabric8_does_not_know() {
    let out = released(FABRIC8).unwrap();
    assert_eq!(
        out,
        r#"{"holderIdentity":"","leaseDuration":"PT15S","acquireTime":"2026-12-06T23:30:00.000000Z","renewTime":"2026-12-06T23:30:02.123456Z","leaderTransitions":0}"#
    );
    assert!(is_released(&out), "{out}");
    let r = parse(&out).unwrap();
    assert_eq!((r.holder, r.duration), (None, secs(15)));
    // A record with both fields is released as client-go's is; one that
    // mentions leaseDurationSeconds in a value is not released at all (the
    // guard could not tell it is fabric8's).
    assert!(matches!(
        released(r#"{"holderIdentity":"a","leaseDuration":"PT15S","note":"leaseDurationSeconds"}"#),
        Err(RecordError::Unreleasable { .. })
    ));
    let both = r#"{"holderIdentity":"pod-a","leaseDurationSeconds":15,"leaseDuration":"PT15S"}"#;
    assert_eq!(
        released(both).unwrap(),
        r#"{"holderIdentity":null,"leaseDurationSeconds":1,"leaseDuration":"PT15S"}"#
    );
}

#[test]
fn is_released_also_takes_fabric8s_empty_holder_alone() {
    for v in [
        r#"{"holderIdentity":""}"#,
        r#"{"holderIdentity":"","leaseDuration":"PT15S"}"#,
        r#"{"holderIdentity":"","renewTime":"2026-12-06T23:30:02Z"}"#,
    ] {
        assert!(is_released(v), "{v}");
    }
    for v in [
        r#"{"holderIdentity":"pod-b"}"#,
        r#"{"holderIdentity":"" ,"leaseDuration":"PT15S"}"#,
        r#"{"holderIdentity":"","leaseDurationSeconds":15}"#,
        r#"{"holderIdentity":"","leaseDuration":"PT15S","leaseDurationSeconds":1}"#,
        r#"{"holderIdentity":"","holderIdentity":"pod-b"}"#,
        r#"{"holderIdentity":"","HOLDERIDENTITY":"pod-b"}"#,
        r#"{"holderIdentity":"","h\u006flderIdentity":"pod-b"}"#,
        r#"{"holderIdentity":"""#,
        r#"{"holderIdentity":"x"}"#,
    ] {
        assert!(!is_released(v), "{v}");
    }
}

#[test]
fn is_release_of_asks_the_record_released_too() {
    for old in [CLIENT_GO, PYTHON, FABRIC8] {
        let out = released(old).unwrap();
        assert!(is_release_of(old, &out), "{old} -> {out}");
    }
    let f8_kept = r#"{"holderIdentity":"","leaseDuration":"PT15S"}"#;
    assert!(is_release_of(FABRIC8, f8_kept));
    // The short form only for fabric8's record, and with its duration kept.
    assert!(!is_release_of(PYTHON, r#"{"holderIdentity":"","x":1}"#));
    assert!(!is_release_of(
        FABRIC8,
        r#"{"holderIdentity":null,"leaseDuration":"PT15S"}"#
    ));
    assert!(!is_release_of(CLIENT_GO, f8_kept));
    assert!(!is_release_of(FABRIC8, r#"{"holderIdentity":""}"#));
    assert!(!is_release_of(
        r#"{"holderIdentity":"a","leaseDuration":"PT15S","note":"leaseDurationSeconds"}"#,
        f8_kept
    ));
    // Nothing to release: empty, released by the janitor or by client-go.
    let long = r#"{"holderIdentity":null,"leaseDurationSeconds":1}"#;
    for old in [
        "",
        long,
        f8_kept,
        r#"{"holderIdentity":"","leaseDurationSeconds":1,"renewTime":"x"}"#,
        r#"{"holderIdentity":""}"#,
    ] {
        assert!(!is_release_of(old, long), "{old}");
    }
    // Held, whatever follows the holder.
    assert!(is_release_of(r#"{"holderIdentity":"pod-a"}"#, long));
    assert!(is_release_of(
        r#"{"leaseDurationSeconds":5,"holderIdentity":"pod-a"}"#,
        long
    ));
}

mod properties;

#[test]
fn an_escape_cut_off_at_the_end_is_refused_as_the_guard_refuses_it() {
    let held = r#"{"holderIdentity":"pod-a"}"#;
    let long = r#"{"holderIdentity":null,"leaseDurationSeconds":1"#;
    // The guard's `\\u00[4-7]` needs three characters after `\u`.
    assert!(!is_release_of(held, &format!(r#"{long},"x":"\u004"#)));
    assert!(!is_release_of(held, &format!(r#"{long},"x":"\u017f"}}"#)));
    assert!(is_release_of(held, &format!(r#"{long},"x":"\u00"#)));
    assert!(is_release_of(held, &format!(r#"{long},"x":"\u017"#)));
    assert!(is_release_of(held, &format!(r#"{long},"x":"\u0030"}}"#)));
}
