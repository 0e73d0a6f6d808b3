//! Partial updates (`PUT /document/v1/...`) applied to a document's fields at the frontend:
//! `assign`, `add`, `remove`, `increment`, `decrement`, `multiply` and `divide` on top-level
//! fields, in Vespa's JSON form: `{"fields":{"title":{"assign":"x"},"n":{"increment":1}}}`.

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
            let current = fields.get(name).cloned().unwrap_or(Value::from(0));
            let value = arithmetic(op, &current, operand)
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
        (Value::Array(items), Value::Array(gone)) => items.retain(|i| !gone.contains(i)),
        (Value::Object(map), Value::Object(gone)) => map.retain(|k, _| !gone.contains_key(k)),
        (Value::Object(map), Value::Array(keys)) => {
            map.retain(|k, _| !keys.iter().any(|g| g.as_str() == Some(k)))
        }
        _ => {
            return Err(format!(
                "remove from field {name:?} needs an array of elements or an object of keys"
            ))
        }
    }
    Ok(())
}

fn arithmetic(op: &str, current: &Value, operand: &Value) -> Result<Value, String> {
    let (Value::Number(a), Value::Number(b)) = (current, operand) else {
        return Err("both the field and the operand must be numbers".into());
    };
    if let (Some(x), Some(y)) = (a.as_i64(), b.as_i64()) {
        let result = match op {
            "increment" => x.checked_add(y),
            "decrement" => x.checked_sub(y),
            "multiply" => x.checked_mul(y),
            _ if y == 0 => return Err("division by zero".into()),
            _ => x.checked_div(y),
        };
        return result
            .map(Value::from)
            .ok_or_else(|| "integer overflow".into());
    }
    let (x, y) = (a.as_f64().unwrap_or(0.0), b.as_f64().unwrap_or(0.0));
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
    fn refusals() {
        let mut fields = json!({"n": 1, "s": "x"}).as_object().unwrap().clone();
        for bad in [
            json!({"n": {"divide": 0}}),
            json!({"s": {"increment": 1}}),
            json!({"n": {"frobnicate": 1}}),
            json!({"n": 5}),
            json!({"n": {}}),
            json!({"s": {"add": ["y"]}}),
            json!({"n": {"increment": i64::MAX}}),
        ] {
            assert!(
                apply(&mut fields, bad.as_object().unwrap()).is_err(),
                "{bad}"
            );
        }
    }
}
