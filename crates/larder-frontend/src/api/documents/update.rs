//! Partial updates (`PUT /document/v1/...`) applied to a document's fields at the frontend:
//! `assign`, `add`, `remove`, `increment`, `decrement`, `multiply` and `divide` on top-level
//! fields, in Vespa's JSON form: `{"fields":{"title":{"assign":"x"},"n":{"increment":1}}}`.
//!
//! Every operation is linear in the sizes of the field and the operand: `remove` looks elements
//! up in a hash set of their canonical JSON, never compares each with each. Integer arithmetic
//! is exact or refused: 64-bit signed and unsigned values are computed in 128 bits and a result
//! outside both ranges is a 400, never a float.

use std::collections::HashSet;

use serde_json::{Map, Number, Value};

pub type Fields = Map<String, Value>;

/// Applies every field update in `updates` (the request's `fields` object) to `fields`.
pub fn apply(fields: &mut Fields, updates: &Fields) -> Result<(), String> {
    for (name, update) in updates {
        let ops = update.as_object().ok_or_else(|| {
            format!("update of field {name:?} must be an object such as {{\"assign\": …}}")
        })?;
        if ops.is_empty() {
            return Err(format!("update of field {name:?} names no operation"));
        }
        for (op, operand) in ops {
            apply_one(fields, name, op, operand)?;
        }
    }
    Ok(())
}

fn apply_one(fields: &mut Fields, name: &str, op: &str, operand: &Value) -> Result<(), String> {
    match op {
        "assign" if operand.is_null() => {
            fields.remove(name);
        }
        "assign" => {
            fields.insert(name.to_owned(), operand.clone());
        }
        "add" => add(fields, name, operand)?,
        "remove" => remove(fields, name, operand)?,
        "increment" | "decrement" | "multiply" | "divide" => {
            // Borrowed, not cloned: the field may be a large text that is about to be refused.
            let zero = Value::from(0);
            let current = fields.get(name).unwrap_or(&zero);
            let value = arithmetic(op, current, operand)
                .map_err(|e| format!("{op} of field {name:?}: {e}"))?;
            fields.insert(name.to_owned(), value);
        }
        other => {
            return Err(format!(
                "unsupported update operation {other:?} on field {name:?} (supported: assign, \
                 add, remove, increment, decrement, multiply, divide)"
            ))
        }
    }
    Ok(())
}

/// `add` appends to an array, or merges keys into a weighted set / map (an object).
fn add(fields: &mut Fields, name: &str, operand: &Value) -> Result<(), String> {
    let current = fields
        .entry(name.to_owned())
        .or_insert_with(|| match operand {
            Value::Object(_) => Value::Object(Map::new()),
            _ => Value::Array(Vec::new()),
        });
    match (current, operand) {
        (Value::Array(items), Value::Array(more)) => items.extend(more.iter().cloned()),
        (Value::Object(map), Value::Object(more)) => {
            map.extend(more.iter().map(|(k, v)| (k.clone(), v.clone())))
        }
        _ => {
            return Err(format!(
                "add to field {name:?} needs an array (for arrays) or an object (for weighted \
                 sets and maps) matching the field"
            ))
        }
    }
    Ok(())
}

/// `remove` deletes the given elements from an array, or the given keys from an object.
fn remove(fields: &mut Fields, name: &str, operand: &Value) -> Result<(), String> {
    let Some(current) = fields.get_mut(name) else {
        return Ok(());
    };
    match (current, operand) {
        (Value::Array(items), Value::Array(gone)) => {
            let gone: HashSet<String> = gone.iter().map(canonical).collect();
            items.retain(|i| !gone.contains(&canonical(i)))
        }
        (Value::Object(map), Value::Object(gone)) => map.retain(|k, _| !gone.contains_key(k)),
        (Value::Object(map), Value::Array(keys)) => {
            let keys: HashSet<&str> = keys.iter().filter_map(Value::as_str).collect();
            map.retain(|k, _| !keys.contains(k.as_str()))
        }
        _ => {
            return Err(format!(
                "remove from field {name:?} needs an array of elements or an object of keys"
            ))
        }
    }
    Ok(())
}

/// A value's JSON with object keys in order (serde_json's `Map` is sorted): two values are
/// equal when their canonical forms are. (`-0.0` and `0.0` differ here, unlike with `==`.)
fn canonical(value: &Value) -> String {
    value.to_string()
}

fn arithmetic(op: &str, current: &Value, operand: &Value) -> Result<Value, String> {
    let (Value::Number(a), Value::Number(b)) = (current, operand) else {
        return Err("both the field and the operand must be numbers".into());
    };
    match (integer(a), integer(b)) {
        (Some(x), Some(y)) => integer_arithmetic(op, x, y),
        // serde_json reads every JSON number as an f64 when it is not a 64-bit integer.
        _ => float_arithmetic(op, a.as_f64().unwrap_or(0.0), b.as_f64().unwrap_or(0.0)),
    }
}

/// An integer in either of JSON's 64-bit ranges (signed, or unsigned above `i64::MAX`).
fn integer(n: &Number) -> Option<i128> {
    n.as_i64()
        .map(i128::from)
        .or_else(|| n.as_u64().map(i128::from))
}

fn integer_arithmetic(op: &str, x: i128, y: i128) -> Result<Value, String> {
    let result = match op {
        "increment" => x.checked_add(y),
        "decrement" => x.checked_sub(y),
        "multiply" => x.checked_mul(y),
        _ if y == 0 => return Err("division by zero".into()),
        _ => x.checked_div(y),
    };
    let overflow = || "integer overflow: the result is outside the 64-bit range".to_owned();
    let result = result.ok_or_else(overflow)?;
    if let Ok(signed) = i64::try_from(result) {
        return Ok(Value::from(signed));
    }
    u64::try_from(result)
        .map(Value::from)
        .map_err(|_| overflow())
}

fn float_arithmetic(op: &str, x: f64, y: f64) -> Result<Value, String> {
    let result = match op {
        "increment" => x + y,
        "decrement" => x - y,
        "multiply" => x * y,
        _ if y == 0.0 => return Err("division by zero".into()),
        _ => x / y,
    };
    Number::from_f64(result)
        .map(Value::Number)
        .ok_or_else(|| "result is not a finite number".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(before: Value, updates: Value, after: Value) {
        let mut fields = before.as_object().unwrap().clone();
        apply(&mut fields, updates.as_object().unwrap()).unwrap();
        assert_eq!(Value::Object(fields), after);
    }

    #[test]
    fn every_operation() {
        check(
            json!({"a": 1, "t": "x"}),
            json!({"t": {"assign": "y"}, "a": {"assign": null}}),
            json!({"t": "y"}),
        );
        check(
            json!({"n": 10, "f": 1.5}),
            json!({"n": {"increment": 5}, "f": {"multiply": 2}}),
            json!({"n": 15, "f": 3.0}),
        );
        check(
            json!({"n": 10}),
            json!({"n": {"decrement": 4}, "m": {"increment": 2}}),
            json!({"n": 6, "m": 2}),
        );
        check(
            json!({"n": 7}),
            json!({"n": {"divide": 2}}),
            json!({"n": 3}),
        );
        check(
            json!({"tags": ["a"], "ws": {"x": 1}}),
            json!({"tags": {"add": ["b", "c"]}, "ws": {"add": {"y": 2}}, "new": {"add": ["z"]}}),
            json!({"tags": ["a", "b", "c"], "ws": {"x": 1, "y": 2}, "new": ["z"]}),
        );
        check(
            json!({"tags": ["a", "b", "a"], "ws": {"x": 1, "y": 2}}),
            json!({"tags": {"remove": ["a"]}, "ws": {"remove": {"x": 0}}, "none": {"remove": ["q"]}}),
            json!({"tags": ["b"], "ws": {"y": 2}}),
        );
    }

    #[test]
    fn integers_stay_integers_across_the_64_bit_ranges() {
        let max = u64::MAX;
        check(
            json!({"u": max - 1, "i": i64::MAX, "n": -5}),
            json!({"u": {"increment": 1}, "i": {"increment": 1}, "n": {"multiply": -3}}),
            json!({"u": max, "i": (i64::MAX as u64) + 1, "n": 15}),
        );
        check(
            json!({"u": max}),
            json!({"u": {"decrement": max}}),
            json!({"u": 0}),
        );
        let mut fields = json!({"u": max}).as_object().unwrap().clone();
        let err = apply(
            &mut fields,
            json!({"u": {"increment": 1}}).as_object().unwrap(),
        );
        assert!(err.unwrap_err().contains("overflow"));
        assert_eq!(fields["u"], json!(max), "unchanged");
    }

    #[test]
    fn removing_many_from_many_is_linear() {
        let n = 40_000;
        let items: Vec<Value> = (0..n).map(|i| json!({"k": i, "s": "x"})).collect();
        let mut fields = json!({}).as_object().unwrap().clone();
        fields.insert("a".into(), Value::Array(items.clone()));
        let started = std::time::Instant::now();
        let updates = json!({"a": {"remove": items[..n - 1]}});
        apply(&mut fields, updates.as_object().unwrap()).unwrap();
        assert_eq!(fields["a"], json!([{"k": n - 1, "s": "x"}]));
        // Generous: the pairwise version took seconds of CPU on this.
        assert!(started.elapsed() < std::time::Duration::from_secs(3));
    }

    proptest::proptest! {
        #[test]
        fn updates_never_panic(
            before in proptest::collection::vec(value(), 0..4),
            updates in proptest::collection::vec(("[a-d]", op(), value()), 0..6),
        ) {
            let mut fields: Fields = before.into_iter().enumerate()
                .map(|(i, v)| (["a", "b", "c", "d"][i].to_owned(), v)).collect();
            let updates: Fields = updates.into_iter()
                .map(|(name, op, v)| (name, json!({ op: v }))).collect();
            let _ = apply(&mut fields, &updates);
        }
    }

    fn op() -> impl proptest::strategy::Strategy<Value = &'static str> {
        proptest::sample::select(vec![
            "assign",
            "add",
            "remove",
            "increment",
            "decrement",
            "multiply",
            "divide",
            "x",
        ])
    }

    fn value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1e300f64..1e300).prop_map(Value::from),
            "[a-c]{0,3}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map("[a-c]", inner, 0..3)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    #[test]
    fn refusals() {
        let mut fields = json!({"n": 1, "s": "x"}).as_object().unwrap().clone();
        for bad in [
            json!({"n": {"divide": 0}}),
            json!({"s": {"increment": 1}}),
            json!({"n": {"frobnicate": 1}}),
            json!({"n": 5}),
            json!({"n": {}}),
            json!({"s": {"add": ["y"]}}),
            json!({"n": {"increment": u64::MAX}}),
            json!({"n": {"decrement": u64::MAX}}),
            json!({"n": {"divide": 0.0}}),
        ] {
            assert!(
                apply(&mut fields, bad.as_object().unwrap()).is_err(),
                "{bad}"
            );
        }
    }
}
