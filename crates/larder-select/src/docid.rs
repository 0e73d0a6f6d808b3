//! The parts of a document ID that a selection can name: `id:<namespace>:<type>:<key=value>:<specific>`,
//! where the optional `<key=value>` is `n=<number>` (`id.user`) or `g=<group>` (`id.group`).

use serde_json::Value;

/// Which part of the document ID an `id…` operand names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdPart {
    /// `id`: the whole ID.
    Whole,
    /// `id.namespace`
    Namespace,
    /// `id.type`
    Type,
    /// `id.user`: the number of `n=<number>`.
    User,
    /// `id.group`: the text of `g=<group>`.
    Group,
    /// `id.specific`: the user-specified part after the last fixed colon.
    Specific,
}

impl IdPart {
    /// The part named by `id.<name>` (case-insensitive, as keywords are).
    pub(crate) fn named(name: &str) -> Option<IdPart> {
        Some(match name.to_ascii_lowercase().as_str() {
            "namespace" => IdPart::Namespace,
            "type" => IdPart::Type,
            "user" => IdPart::User,
            "group" => IdPart::Group,
            "specific" => IdPart::Specific,
            _ => return None,
        })
    }

    /// This part of `id`; null when the ID has no such part (an ID without `n=` has no
    /// `id.user`, one that is not of the `id:` scheme has only `id`).
    pub(crate) fn of(self, id: &str) -> Value {
        if self == IdPart::Whole {
            return Value::String(id.to_owned());
        }
        let Some(rest) = id.strip_prefix("id:") else {
            return Value::Null;
        };
        let mut parts = rest.splitn(4, ':');
        let (Some(namespace), Some(doctype), Some(pairs), Some(specific)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Value::Null;
        };
        let text = |s: &str| Value::String(s.to_owned());
        match self {
            IdPart::Namespace => text(namespace),
            IdPart::Type => text(doctype),
            IdPart::Specific => text(specific),
            IdPart::User => pairs
                .strip_prefix("n=")
                .and_then(|n| n.parse::<u64>().ok())
                .map_or(Value::Null, Value::from),
            IdPart::Group => pairs.strip_prefix("g=").map_or(Value::Null, text),
            IdPart::Whole => unreachable!("handled above"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_part() {
        let id = "id:ns:music:n=42:a:b";
        assert_eq!(IdPart::Whole.of(id), json!(id));
        assert_eq!(IdPart::Namespace.of(id), json!("ns"));
        assert_eq!(IdPart::Type.of(id), json!("music"));
        assert_eq!(IdPart::User.of(id), json!(42));
        assert_eq!(IdPart::Group.of(id), Value::Null);
        assert_eq!(IdPart::Specific.of(id), json!("a:b"));
        assert_eq!(IdPart::Group.of("id:ns:music:g=x y:1"), json!("x y"));
        assert_eq!(IdPart::User.of("id:ns:music::1"), Value::Null);
        assert_eq!(IdPart::Namespace.of("not-an-id"), Value::Null);
        assert_eq!(IdPart::Specific.of("id:ns:music"), Value::Null);
    }
}
