//! Go `[]byte` in JSON: standard base64 with padding; a nil slice is `null`.

/// `Vec<u8>` fields (usually with `omitempty`): `null` decodes as empty.
pub mod vec {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserializer, Serializer};

    /// Serialises as a base64 string.
    ///
    /// # Errors
    ///
    /// Only those of the serializer.
    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    /// Deserialises a base64 string or `null`.
    ///
    /// # Errors
    ///
    /// When the value is neither, or is not valid padded standard base64.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        Ok(super::option::deserialize(d)?.unwrap_or_default())
    }
}

/// `Option<Vec<u8>>` fields without `omitempty`: `None` is Go's nil slice, i.e. `null`.
pub mod option {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Serialises `None` as `null`, bytes as a base64 string.
    ///
    /// # Errors
    ///
    /// Only those of the serializer.
    #[allow(clippy::ref_option)] // serde's `with` hands us `&Option<_>`.
    pub fn serialize<S: Serializer>(bytes: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match bytes {
            None => s.serialize_none(),
            Some(b) => s.serialize_str(&STANDARD.encode(b)),
        }
    }

    /// Deserialises `null` as `None` and a base64 string as bytes.
    ///
    /// # Errors
    ///
    /// When the value is neither, or is not valid padded standard base64.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        let Some(text) = Option::<String>::deserialize(d)? else {
            return Ok(None);
        };
        // Go's decoder skips CR and LF inside base64 text.
        let text: String = text.chars().filter(|c| *c != '\r' && *c != '\n').collect();
        STANDARD.decode(text.as_bytes()).map(Some).map_err(serde::de::Error::custom)
    }
}
