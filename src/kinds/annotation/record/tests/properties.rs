//! Properties over any string and any object: nothing panics, a release
//! keeps every other field as written, and the guard admits what the
//! janitor writes.

use super::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

fn config() -> Config {
    Config {
        rng_seed: RngSeed::Fixed(20261206),
        ..Config::default()
    }
}

/// JSON values of a few levels, with the record's own keys likely.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e6f64..1e6).prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::from),
        Just(Value::from("2026-12-06 23:30:02.345678")),
        Just(Value::from("2026-12-06T23:30:02Z")),
        Just(Value::from("60")),
        Just(Value::from("PT15S")),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            proptest::collection::btree_map(key(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(HOLDER.to_owned()),
        Just(DURATION.to_owned()),
        Just(FABRIC8_DURATION.to_owned()),
        Just(RENEW.to_owned()),
        Just("acquireTime".to_owned()),
        Just("leaderTransitions".to_owned()),
        Just("HolderIdentity".to_owned()),
        "[a-zA-Z]{1,8}",
        "\\PC{0,6}",
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn parse_and_released_never_panic_on_any_string(s in "\\PC{0,64}|[{}\\[\\]\",: a-z0-9\\\\]{0,64}") {
        let _ = parse(&s);
        if let Ok(out) = released(&s) {
            prop_assert!(is_released(&out), "{}", out);
        }
        let _ = is_released(&s);
    }

    #[test]
    fn released_of_any_object_keeps_its_other_fields(
        fields in proptest::collection::btree_map(key(), json(), 0..6),
        pretty in any::<bool>(),
    ) {
        let original = Value::Object(fields.into_iter().collect());
        let text = if pretty {
            serde_json::to_string_pretty(&original).unwrap()
        } else {
            serde_json::to_string(&original).unwrap()
        };
        match released(&text) {
            Ok(out) => {
                prop_assert!(is_released(&out), "{}", out);
                // The guard admits it, unless the record was free already.
                prop_assert!(was_released(&text) || is_release_of(&text, &out), "{} -> {}", text, out);
                let mut want = obj(&text);
                let fabric8 = want.contains_key(FABRIC8_DURATION)
                    && !fold(&text).contains("leasedurationseconds");
                let knows_fabric8 = want.contains_key(FABRIC8_DURATION);
                want.retain(|k, _| !folds_to(k, HOLDER) && !folds_to(k, DURATION));
                let mut got = obj(&out);
                prop_assert_eq!(got.remove(HOLDER), Some(Value::Null));
                if fabric8 {
                    prop_assert!(!out.contains(DURATION), "{}", out);
                } else {
                    prop_assert_eq!(got.remove(DURATION), Some(Value::from(1)));
                }
                prop_assert_eq!(got, want);
                if let Ok(r) = parse(&out) {
                    prop_assert_eq!(r.holder, None);
                    if !knows_fabric8 {
                        prop_assert_eq!(r.duration, secs(1));
                    }
                }
            }
            Err(RecordError::Unreleasable { .. }) => {}
            Err(e) => prop_assert!(false, "{}: {}", text, e),
        }
    }
}
