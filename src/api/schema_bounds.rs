//! States the request limits of [`crate::model::request_bounds`] on the generated OpenAPI
//! schemas (utoipa's attributes take only literals, so the limits are applied here from the
//! same constants `validate()` checks).

use utoipa::openapi::schema::Schema;
use utoipa::openapi::{OpenApi, RefOr};

use crate::model::request_bounds::{DOCUMENTED_BOUNDS, DocumentedBound};

/// Applies every documented bound; a bound naming a schema or property the document lacks is
/// a programming error (the unit test below catches it).
pub(super) fn apply(document: &mut OpenApi) {
    let Some(components) = document.components.as_mut() else { return };
    for &(schema_name, property, bound) in DOCUMENTED_BOUNDS {
        let applied = match components.schemas.get_mut(schema_name) {
            Some(RefOr::T(Schema::Object(object))) => match object.properties.get_mut(property) {
                Some(RefOr::T(schema)) => set(schema, bound),
                _ => false,
            },
            _ => false,
        };
        debug_assert!(applied, "{schema_name}.{property} cannot take {bound:?}");
    }
}

fn set(schema: &mut Schema, bound: DocumentedBound) -> bool {
    match (schema, bound) {
        (Schema::Object(object), DocumentedBound::Integer(bounds)) => {
            object.minimum = Some(bounds.min.into());
            object.maximum = bounds.max.map(Into::into);
            true
        }
        (Schema::Object(object), DocumentedBound::MaxLength(chars)) => {
            object.max_length = Some(chars);
            true
        }
        (Schema::Object(object), DocumentedBound::MaxProperties(entries)) => {
            object.max_properties = Some(entries);
            true
        }
        (Schema::Array(array), DocumentedBound::MaxItems(items)) => {
            array.max_items = Some(items);
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use crate::model::request_bounds::BATCHING_MAX_BYTES;

    #[test]
    fn every_documented_bound_lands_on_its_property() {
        // `apply` asserts (debug) that each bound found its property.
        let document = serde_json::to_value(super::super::openapi()).unwrap();
        let schemas = &document["components"]["schemas"];
        assert_eq!(schemas["Batching"]["properties"]["max_bytes"]["maximum"], BATCHING_MAX_BYTES.max.unwrap());
        assert_eq!(schemas["TableOptionsDeclaration"]["properties"]["clustering"]["maxItems"], 4);
        assert_eq!(schemas["TableOptionsDeclaration"]["properties"]["labels"]["maxProperties"], 64);
        assert_eq!(schemas["CreateRunRequest"]["properties"]["maximum_bytes_billed"]["minimum"], 1);
    }
}
