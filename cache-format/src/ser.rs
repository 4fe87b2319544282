//! A serde `Serializer` that turns any `Serialize` type into canonical [`Value`]s, so a key
//! can be a plain Rust struct and still fingerprint exactly like the same key given as JSON.

use std::fmt;

use serde::ser::{self, Impossible, Serialize};

use crate::value::{Fields, Value};

/// Why a value could not be turned into canonical fields.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ValueError(pub(crate) String);

impl ser::Error for ValueError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        ValueError(msg.to_string())
    }
}

/// Converts any `Serialize` value into a canonical [`Value`].
///
/// Structs and maps become [`Value::Map`] (field order does not matter), sequences and tuples
/// become lists, unit enum variants become their name, other variants a one-field map
/// `{variant: content}`. `None` fields are left out. Floats, bytes, null and maps with
/// non-string keys are rejected.
pub(crate) fn to_value<T: Serialize + ?Sized>(value: &T) -> Result<Value, ValueError> {
    value
        .serialize(ValueSerializer)?
        .ok_or_else(|| ValueError("a value is required here, not None".into()))
}

/// Converts any `Serialize` struct or map into canonical fields.
///
/// Structs and maps become maps (field order does not matter), sequences and tuples become
/// lists, unit enum variants become their name, other variants a one-field map
/// `{variant: content}`. `None` fields are left out. Floats, bytes, null and maps with
/// non-string keys are rejected, and so is a value that is not a map at the top.
pub fn to_fields<T: Serialize + ?Sized>(value: &T) -> Result<Fields, ValueError> {
    match to_value(value)? {
        Value::Map(fields) => Ok(fields),
        other => Err(ValueError(format!(
            "expected a struct or a map of named fields, got {other}"
        ))),
    }
}

/// Serializes into `Option<Value>`: `None` stands for an absent optional field.
struct ValueSerializer;

fn int<T: TryInto<i64> + fmt::Display + Copy>(v: T) -> Result<Option<Value>, ValueError> {
    v.try_into()
        .map(|i| Some(Value::Int(i)))
        .map_err(|_| ValueError(format!("integer {v} does not fit in i64")))
}

impl ser::Serializer for ValueSerializer {
    type Ok = Option<Value>;
    type Error = ValueError;
    type SerializeSeq = SeqSerializer;
    type SerializeTuple = SeqSerializer;
    type SerializeTupleStruct = SeqSerializer;
    type SerializeTupleVariant = VariantSerializer<SeqSerializer>;
    type SerializeMap = MapSerializer;
    type SerializeStruct = MapSerializer;
    type SerializeStructVariant = VariantSerializer<MapSerializer>;

    fn serialize_bool(self, v: bool) -> Result<Self::Ok, ValueError> {
        Ok(Some(Value::Bool(v)))
    }
    fn serialize_i8(self, v: i8) -> Result<Self::Ok, ValueError> {
        int(v)
    }
    fn serialize_i16(self, v: i16) -> Result<Self::Ok, ValueError> {
        int(v)
    }
    fn serialize_i32(self, v: i32) -> Result<Self::Ok, ValueError> {
        int(v)
    }
    fn serialize_i64(self, v: i64) -> Result<Self::Ok, ValueError> {
        int(v)
    }
    fn serialize_i128(self, v: i128) -> Result<Self::Ok, ValueError> {
        int(v)
    }
    fn serialize_u8(self, v: u8) -> Result<Self::Ok, ValueError> {
        int(v)
    }
    fn serialize_u16(self, v: u16) -> Result<Self::Ok, ValueError> {
        int(v)
    }
    fn serialize_u32(self, v: u32) -> Result<Self::Ok, ValueError> {
        int(v)
    }
    fn serialize_u64(self, v: u64) -> Result<Self::Ok, ValueError> {
        int(v)
    }
    fn serialize_u128(self, v: u128) -> Result<Self::Ok, ValueError> {
        int(v)
    }
    fn serialize_f32(self, v: f32) -> Result<Self::Ok, ValueError> {
        self.serialize_f64(f64::from(v))
    }
    fn serialize_f64(self, v: f64) -> Result<Self::Ok, ValueError> {
        Err(ValueError(format!(
            "floats are not allowed in keys, scopes or params (got {v}); use an integer or a string"
        )))
    }
    fn serialize_char(self, v: char) -> Result<Self::Ok, ValueError> {
        Ok(Some(Value::Str(v.to_string())))
    }
    fn serialize_str(self, v: &str) -> Result<Self::Ok, ValueError> {
        Ok(Some(Value::Str(v.to_owned())))
    }
    fn serialize_bytes(self, _v: &[u8]) -> Result<Self::Ok, ValueError> {
        Err(ValueError(
            "bytes are not allowed in keys; hash them and use the hex digest".into(),
        ))
    }
    fn serialize_none(self) -> Result<Self::Ok, ValueError> {
        Ok(None)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<Self::Ok, ValueError> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<Self::Ok, ValueError> {
        Err(ValueError("unit values are not allowed in keys".into()))
    }
    fn serialize_unit_struct(self, name: &'static str) -> Result<Self::Ok, ValueError> {
        Ok(Some(Value::Str(name.to_owned())))
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<Self::Ok, ValueError> {
        Ok(Some(Value::Str(variant.to_owned())))
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<Self::Ok, ValueError> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<Self::Ok, ValueError> {
        let inner = to_value(value)?;
        Ok(Some(Value::Map(Fields::from([(
            variant.to_owned(),
            inner,
        )]))))
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<SeqSerializer, ValueError> {
        Ok(SeqSerializer(Vec::with_capacity(len.unwrap_or(0).min(64))))
    }
    fn serialize_tuple(self, len: usize) -> Result<SeqSerializer, ValueError> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        len: usize,
    ) -> Result<SeqSerializer, ValueError> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self::SerializeTupleVariant, ValueError> {
        Ok(VariantSerializer {
            variant,
            inner: self.serialize_seq(Some(len))?,
        })
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<MapSerializer, ValueError> {
        Ok(MapSerializer::default())
    }
    fn serialize_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<MapSerializer, ValueError> {
        Ok(MapSerializer::default())
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, ValueError> {
        Ok(VariantSerializer {
            variant,
            inner: MapSerializer::default(),
        })
    }
}

struct SeqSerializer(Vec<Value>);

impl SeqSerializer {
    fn push<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), ValueError> {
        match value.serialize(ValueSerializer)? {
            Some(v) => {
                self.0.push(v);
                Ok(())
            }
            None => Err(ValueError(
                "None is not allowed inside a list; a list's positions must all be present".into(),
            )),
        }
    }
}

impl ser::SerializeSeq for SeqSerializer {
    type Ok = Option<Value>;
    type Error = ValueError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), ValueError> {
        self.push(value)
    }
    fn end(self) -> Result<Self::Ok, ValueError> {
        Ok(Some(Value::List(self.0)))
    }
}

impl ser::SerializeTuple for SeqSerializer {
    type Ok = Option<Value>;
    type Error = ValueError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), ValueError> {
        self.push(value)
    }
    fn end(self) -> Result<Self::Ok, ValueError> {
        Ok(Some(Value::List(self.0)))
    }
}

impl ser::SerializeTupleStruct for SeqSerializer {
    type Ok = Option<Value>;
    type Error = ValueError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), ValueError> {
        self.push(value)
    }
    fn end(self) -> Result<Self::Ok, ValueError> {
        Ok(Some(Value::List(self.0)))
    }
}

#[derive(Default)]
struct MapSerializer {
    fields: Fields,
    next_key: Option<String>,
}

impl MapSerializer {
    fn insert(&mut self, name: String, value: Option<Value>) -> Result<(), ValueError> {
        if let Some(value) = value {
            if self.fields.contains_key(&name) {
                return Err(ValueError(format!("duplicate field {name:?}")));
            }
            self.fields.insert(name, value);
        }
        Ok(())
    }
}

impl ser::SerializeMap for MapSerializer {
    type Ok = Option<Value>;
    type Error = ValueError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), ValueError> {
        self.next_key = Some(key.serialize(KeySerializer)?);
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), ValueError> {
        let name = self
            .next_key
            .take()
            .ok_or_else(|| ValueError("map value without a key".into()))?;
        let value = value.serialize(ValueSerializer)?;
        self.insert(name, value)
    }
    fn end(self) -> Result<Self::Ok, ValueError> {
        Ok(Some(Value::Map(self.fields)))
    }
}

impl ser::SerializeStruct for MapSerializer {
    type Ok = Option<Value>;
    type Error = ValueError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), ValueError> {
        let value = value.serialize(ValueSerializer)?;
        self.insert(key.to_owned(), value)
    }
    fn end(self) -> Result<Self::Ok, ValueError> {
        Ok(Some(Value::Map(self.fields)))
    }
}

struct VariantSerializer<S> {
    variant: &'static str,
    inner: S,
}

impl ser::SerializeTupleVariant for VariantSerializer<SeqSerializer> {
    type Ok = Option<Value>;
    type Error = ValueError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), ValueError> {
        self.inner.push(value)
    }
    fn end(self) -> Result<Self::Ok, ValueError> {
        let inner = Value::List(self.inner.0);
        Ok(Some(Value::Map(Fields::from([(
            self.variant.to_owned(),
            inner,
        )]))))
    }
}

impl ser::SerializeStructVariant for VariantSerializer<MapSerializer> {
    type Ok = Option<Value>;
    type Error = ValueError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), ValueError> {
        ser::SerializeStruct::serialize_field(&mut self.inner, key, value)
    }
    fn end(self) -> Result<Self::Ok, ValueError> {
        let inner = Value::Map(self.inner.fields);
        Ok(Some(Value::Map(Fields::from([(
            self.variant.to_owned(),
            inner,
        )]))))
    }
}

/// Map keys must be strings (or unit variants, which are names).
struct KeySerializer;

fn key_error() -> ValueError {
    ValueError("map keys must be strings".into())
}

impl ser::Serializer for KeySerializer {
    type Ok = String;
    type Error = ValueError;
    type SerializeSeq = Impossible<String, ValueError>;
    type SerializeTuple = Impossible<String, ValueError>;
    type SerializeTupleStruct = Impossible<String, ValueError>;
    type SerializeTupleVariant = Impossible<String, ValueError>;
    type SerializeMap = Impossible<String, ValueError>;
    type SerializeStruct = Impossible<String, ValueError>;
    type SerializeStructVariant = Impossible<String, ValueError>;

    fn serialize_str(self, v: &str) -> Result<String, ValueError> {
        Ok(v.to_owned())
    }
    fn serialize_char(self, v: char) -> Result<String, ValueError> {
        Ok(v.to_string())
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<String, ValueError> {
        Ok(variant.to_owned())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<String, ValueError> {
        value.serialize(self)
    }
    fn serialize_bool(self, _v: bool) -> Result<String, ValueError> {
        Err(key_error())
    }
    fn serialize_i8(self, _v: i8) -> Result<String, ValueError> {
        Err(key_error())
    }
    fn serialize_i16(self, _v: i16) -> Result<String, ValueError> {
        Err(key_error())
    }
    fn serialize_i32(self, _v: i32) -> Result<String, ValueError> {
        Err(key_error())
    }
    fn serialize_i64(self, _v: i64) -> Result<String, ValueError> {
        Err(key_error())
    }
    fn serialize_u8(self, _v: u8) -> Result<String, ValueError> {
        Err(key_error())
    }
    fn serialize_u16(self, _v: u16) -> Result<String, ValueError> {
        Err(key_error())
    }
    fn serialize_u32(self, _v: u32) -> Result<String, ValueError> {
        Err(key_error())
    }
    fn serialize_u64(self, _v: u64) -> Result<String, ValueError> {
        Err(key_error())
    }
    fn serialize_f32(self, _v: f32) -> Result<String, ValueError> {
        Err(key_error())
    }
    fn serialize_f64(self, _v: f64) -> Result<String, ValueError> {
        Err(key_error())
    }
    fn serialize_bytes(self, _v: &[u8]) -> Result<String, ValueError> {
        Err(key_error())
    }
    fn serialize_none(self) -> Result<String, ValueError> {
        Err(key_error())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, _value: &T) -> Result<String, ValueError> {
        Err(key_error())
    }
    fn serialize_unit(self) -> Result<String, ValueError> {
        Err(key_error())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<String, ValueError> {
        Err(key_error())
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<String, ValueError> {
        Err(key_error())
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, ValueError> {
        Err(key_error())
    }
    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, ValueError> {
        Err(key_error())
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleStruct, ValueError> {
        Err(key_error())
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, ValueError> {
        Err(key_error())
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, ValueError> {
        Err(key_error())
    }
    fn serialize_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStruct, ValueError> {
        Err(key_error())
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, ValueError> {
        Err(key_error())
    }
}
