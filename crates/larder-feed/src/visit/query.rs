//! The query string of a visit's page requests, in Vespa's parameters (the answer is read by
//! `scanner`).

/// What one slice asks for on every page (the continuation is added per page).
#[derive(Clone, Debug, Default)]
pub(crate) struct PageQuery {
    pub selection: Option<String>,
    pub field_set: Option<String>,
    pub cluster: Option<String>,
    pub wanted_document_count: Option<u32>,
    pub stream: bool,
    /// `(slices, slice_id)`; `None` visits everything in one slice.
    pub slice: Option<(u32, u32)>,
}

impl PageQuery {
    /// The query string of the page after `continuation` (the first page without one).
    pub(crate) fn to_query(&self, continuation: Option<&str>) -> String {
        let mut pairs: Vec<(&str, String)> = Vec::new();
        let mut optional = |name, value: &Option<String>| {
            if let Some(value) = value {
                pairs.push((name, value.clone()));
            }
        };
        optional("cluster", &self.cluster);
        optional("selection", &self.selection);
        optional("fieldSet", &self.field_set);
        if let Some(count) = self.wanted_document_count {
            pairs.push(("wantedDocumentCount", count.to_string()));
        }
        if let Some((slices, id)) = self.slice {
            pairs.push(("slices", slices.to_string()));
            pairs.push(("sliceId", id.to_string()));
        }
        pairs.push(("stream", self.stream.to_string()));
        if let Some(continuation) = continuation {
            pairs.push(("continuation", continuation.to_owned()));
        }
        let encoded: Vec<String> = pairs
            .iter()
            .map(|(name, value)| format!("{name}={}", crate::operation::encode(value)))
            .collect();
        encoded.join("&")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_carry_every_parameter_encoded() {
        let query = PageQuery {
            selection: Some("music.title = 'a b*' and id.user == 1+1&x".into()),
            field_set: Some("music:[document]".into()),
            cluster: Some("content".into()),
            wanted_document_count: Some(500),
            stream: true,
            slice: Some((4, 3)),
        };
        assert_eq!(
            query.to_query(Some("AAB+/=")),
            "cluster=content\
             &selection=music.title%20%3D%20%27a%20b%2A%27%20and%20id.user%20%3D%3D%201%2B1%26x\
             &fieldSet=music%3A%5Bdocument%5D&wantedDocumentCount=500&slices=4&sliceId=3\
             &stream=true&continuation=AAB%2B%2F%3D"
        );
        assert_eq!(PageQuery::default().to_query(None), "stream=false");
    }
}
