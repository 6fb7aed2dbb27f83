//! The simulator's responses and the client's requests, checked against the
//! OpenAPI description in shared/equinix-metal-openapi: every field the JSON
//! has must be a property of the schema with the right type (and format, for
//! uuid and date-time), every required property must be there, and every
//! status must be one the path declares.

use std::path::{Path, PathBuf};

use serde_json::Value;
use shepherd::equinix::model::{DeviceAction, SshKeyInput};

use crate::{client, create_request, settings, simulator};

/// The description: `SHEPHERD_EQUINIX_OPENAPI`, else the shared
/// directory beside the checkout (it is reference data, not the project's).
fn spec_root() -> PathBuf {
    match std::env::var_os("SHEPHERD_EQUINIX_OPENAPI") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/equinix-metal-openapi"),
    }
}

fn load(file: &Path) -> Value {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// A schema and the file it came from (refs are relative to it).
struct Schema {
    value: Value,
    file: PathBuf,
}

impl Schema {
    fn file(rel: &str) -> Schema {
        let file = spec_root().join(rel);
        Schema {
            value: load(&file),
            file,
        }
    }

    fn resolve(&self, v: &Value) -> Schema {
        if let Some(r) = v.get("$ref").and_then(Value::as_str) {
            let file = self.file.parent().unwrap().join(r);
            let file = file.canonicalize().unwrap_or(file);
            return Schema {
                value: load(&file),
                file,
            };
        }
        Schema {
            value: v.clone(),
            file: self.file.clone(),
        }
    }
}

/// Problems of `data` against `schema`, each with its JSON path.
fn check(data: &Value, schema: &Schema, at: &str, out: &mut Vec<String>) {
    let s = schema.resolve(&schema.value);
    if let Some(all) = s.value.get("allOf").and_then(Value::as_array) {
        // Every part applies; properties of one part are allowed by the
        // others, so check them merged.
        let mut merged = serde_json::Map::new();
        let mut required = Vec::new();
        for part in all {
            let p = s.resolve(part);
            let p = p.resolve(&p.value);
            if let Some(props) = p.value.get("properties").and_then(Value::as_object) {
                for (k, v) in props {
                    // Keep each property's refs relative to its own file.
                    merged.insert(k.clone(), absolutize(v, &p.file));
                }
            }
            if let Some(r) = p.value.get("required").and_then(Value::as_array) {
                required.extend(r.iter().cloned());
            }
        }
        let obj =
            serde_json::json!({ "type": "object", "properties": merged, "required": required });
        check(
            data,
            &Schema {
                value: obj,
                file: s.file.clone(),
            },
            at,
            out,
        );
        return;
    }
    if let Some(one) = s.value.get("oneOf").and_then(Value::as_array) {
        let fits = one.iter().any(|o| {
            let mut errs = Vec::new();
            check(data, &s.resolve(o), at, &mut errs);
            errs.is_empty()
        });
        if !fits {
            out.push(format!("{at}: matches none of the oneOf schemas"));
        }
        return;
    }
    let ty = s.value.get("type").and_then(Value::as_str);
    let ok = match (ty, data) {
        (None, _) => true,
        (Some("object"), Value::Object(_)) => true,
        (Some("array"), Value::Array(_)) => true,
        (Some("string"), Value::String(_)) => true,
        (Some("boolean"), Value::Bool(_)) => true,
        (Some("integer"), Value::Number(n)) => n.is_i64() || n.is_u64(),
        (Some("number"), Value::Number(_)) => true,
        _ => false,
    };
    if !ok {
        out.push(format!("{at}: expected {}, found {data}", ty.unwrap()));
        return;
    }
    if let (Some(format), Value::String(v)) = (s.value.get("format").and_then(Value::as_str), data)
    {
        let valid = match format {
            "uuid" => uuid::Uuid::parse_str(v).is_ok(),
            "date-time" => humantime::parse_rfc3339_weak(v).is_ok(),
            _ => true,
        };
        if !valid {
            out.push(format!("{at}: {v:?} is not a {format}"));
        }
    }
    if let Some(e) = s.value.get("enum").and_then(Value::as_array)
        && !e.contains(data)
    {
        out.push(format!("{at}: {data} is not one of {e:?}"));
    }
    match data {
        Value::Object(map) => {
            let props = s.value.get("properties").and_then(Value::as_object);
            for (k, v) in map {
                match props.and_then(|p| p.get(k)) {
                    Some(p) => check(v, &s.resolve(p), &format!("{at}.{k}"), out),
                    None if props.is_some() => out.push(format!("{at}.{k}: not in the schema")),
                    None => {}
                }
            }
            for r in s
                .value
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let r = r.as_str().unwrap();
                if !map.contains_key(r) {
                    out.push(format!("{at}: required {r} missing"));
                }
            }
        }
        Value::Array(items) => {
            if let Some(item) = s.value.get("items") {
                for (i, v) in items.iter().enumerate() {
                    check(v, &s.resolve(item), &format!("{at}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

/// A property schema whose `$ref` is made absolute, so it can move files.
fn absolutize(v: &Value, file: &Path) -> Value {
    match v.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let abs = file.parent().unwrap().join(r);
            serde_json::json!({ "$ref": abs.to_str().unwrap() })
        }
        None => {
            let mut v = v.clone();
            if let Some(items) = v
                .get("items")
                .and_then(|i| i.get("$ref"))
                .and_then(Value::as_str)
            {
                let abs = file.parent().unwrap().join(items);
                v["items"] = serde_json::json!({ "$ref": abs.to_str().unwrap() });
            }
            v
        }
    }
}

fn assert_fits(what: &str, data: &Value, schema_file: &str) {
    let mut errs = Vec::new();
    check(data, &Schema::file(schema_file), "$", &mut errs);
    assert!(
        errs.is_empty(),
        "{what} against {schema_file}:\n{}",
        errs.join("\n")
    );
}

/// The statuses `path_file` declares for `method`.
fn declared_statuses(path_file: &str, method: &str) -> Vec<u16> {
    let v = load(&spec_root().join(path_file));
    v[method]["responses"]
        .as_object()
        .unwrap_or_else(|| panic!("{path_file} has no {method}"))
        .keys()
        .filter_map(|k| k.parse().ok())
        .collect()
}

struct Raw {
    http: awc::Client,
    base: String,
    token: String,
}

impl Raw {
    async fn call(
        &self,
        method: awc::http::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .insert_header(("X-Auth-Token", self.token.as_str()));
        let mut resp = match body {
            Some(b) => req.send_json(&b).await.unwrap(),
            None => req.send().await.unwrap(),
        };
        let status = resp.status().as_u16();
        let bytes = resp.body().await.unwrap();
        let v = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        (status, v)
    }
}

#[actix_rt::test]
async fn simulator_responses_and_client_requests_match_the_openapi_description() {
    use awc::http::Method;
    let sim = simulator(3).await;
    let api = client(settings(&sim));
    let raw = Raw {
        http: awc::Client::default(),
        base: sim.api_url(),
        token: sim.token().to_string(),
    };
    let pid = sim.project_id().to_string();
    let r = sim.reservation_ids();

    // Requests the client sends.
    let create = create_request(&r[0], 0);
    assert_fits(
        "device create request",
        &serde_json::to_value(&create).unwrap(),
        "components/schemas/DeviceCreateInMetroInput.yaml",
    );
    let action = serde_json::to_value(DeviceAction {
        kind: "reboot".into(),
    })
    .unwrap();
    assert_fits(
        "device action",
        &action,
        "components/schemas/DeviceActionInput.yaml",
    );
    let key_in = SshKeyInput {
        label: Some("shepherd".into()),
        key: Some("ssh-ed25519 AAAA x".into()),
        tags: None,
    };
    assert_fits(
        "ssh key create",
        &serde_json::to_value(&key_in).unwrap(),
        "components/schemas/SSHKeyCreateInput.yaml",
    );
    assert_fits(
        "ssh key update",
        &serde_json::to_value(&key_in).unwrap(),
        "components/schemas/SSHKeyInput.yaml",
    );

    // Responses, with the client's models parsing each (through the client).
    let dev = api.create_device(create.clone()).await.unwrap();
    let (st, v) = raw
        .call(Method::GET, &format!("/devices/{}", dev.id), None)
        .await;
    assert!(declared_statuses("paths/devices/id.yaml", "get").contains(&st));
    assert_fits("device", &v, "components/schemas/Device.yaml");

    let (st, v) = raw
        .call(
            Method::POST,
            &format!("/projects/{pid}/devices"),
            Some(serde_json::to_value(create_request(&r[1], 1)).unwrap()),
        )
        .await;
    assert!(
        declared_statuses("paths/projects/id/devices.yaml", "post").contains(&st),
        "{st}"
    );
    assert_fits("created device", &v, "components/schemas/Device.yaml");

    let (st, v) = raw
        .call(
            Method::GET,
            &format!("/projects/{pid}/devices?page=1&per_page=1"),
            None,
        )
        .await;
    assert!(declared_statuses("paths/projects/id/devices.yaml", "get").contains(&st));
    assert_fits("device list", &v, "components/schemas/DeviceList.yaml");
    assert!(v["meta"]["next"]["href"].is_string());
    assert_eq!(api.list_devices().await.unwrap().len(), 2);

    let (st, v) = raw
        .call(
            Method::GET,
            &format!("/projects/{pid}/hardware-reservations"),
            None,
        )
        .await;
    assert!(declared_statuses("paths/projects/id/hardware-reservations.yaml", "get").contains(&st));
    assert_fits(
        "reservation list",
        &v,
        "components/schemas/HardwareReservationList.yaml",
    );
    assert_eq!(api.list_reservations().await.unwrap().len(), 3);

    let (st, v) = raw
        .call(
            Method::GET,
            &format!("/hardware-reservations/{}?include=device", r[0]),
            None,
        )
        .await;
    assert!(declared_statuses("paths/hardware-reservations/id.yaml", "get").contains(&st));
    assert_fits(
        "reservation with device",
        &v,
        "components/schemas/HardwareReservation.yaml",
    );
    assert!(v["device"]["state"].is_string(), "device not included: {v}");
    assert_eq!(
        api.get_reservation(&r[0])
            .await
            .unwrap()
            .device()
            .unwrap()
            .id,
        dev.id
    );

    let (st, _) = raw
        .call(
            Method::POST,
            &format!("/devices/{}/actions", dev.id),
            Some(action),
        )
        .await;
    assert!(
        declared_statuses("paths/devices/id/actions.yaml", "post").contains(&st),
        "{st}"
    );

    let (st, v) = raw
        .call(
            Method::POST,
            &format!("/projects/{pid}/ssh-keys"),
            Some(serde_json::to_value(&key_in).unwrap()),
        )
        .await;
    assert!(
        declared_statuses("paths/projects/id/ssh-keys.yaml", "post").contains(&st),
        "{st}"
    );
    assert_fits("ssh key", &v, "components/schemas/SSHKey.yaml");
    let kid = v["id"].as_str().unwrap().to_string();
    let (st, v) = raw
        .call(
            Method::PUT,
            &format!("/ssh-keys/{kid}"),
            Some(serde_json::json!({"key": "ssh-ed25519 BBBB y"})),
        )
        .await;
    assert!(
        declared_statuses("paths/ssh-keys/id.yaml", "put").contains(&st),
        "{st}"
    );
    assert_fits("updated ssh key", &v, "components/schemas/SSHKey.yaml");
    let (st, v) = raw
        .call(Method::GET, &format!("/projects/{pid}/ssh-keys"), None)
        .await;
    assert!(declared_statuses("paths/projects/id/ssh-keys.yaml", "get").contains(&st));
    assert_fits("ssh key list", &v, "components/schemas/SSHKeyList.yaml");
    assert_eq!(api.list_ssh_keys().await.unwrap().len(), 1);

    let (st, v) = raw
        .call(
            Method::GET,
            "/devices/00000000-0000-0000-0000-000000000000",
            None,
        )
        .await;
    assert_eq!(st, 404);
    assert!(declared_statuses("paths/devices/id.yaml", "get").contains(&st));
    assert_fits("error", &v, "components/schemas/Error.yaml");
    let (st, v) = raw
        .call(
            Method::POST,
            &format!("/projects/{pid}/devices"),
            Some(serde_json::json!({"hostname": "x"})),
        )
        .await;
    assert!(
        declared_statuses("paths/projects/id/devices.yaml", "post").contains(&st),
        "{st}"
    );
    assert_fits("error", &v, "components/schemas/Error.yaml");

    let (st, _) = raw
        .call(Method::DELETE, &format!("/devices/{}", dev.id), None)
        .await;
    assert!(
        declared_statuses("paths/devices/id.yaml", "delete").contains(&st),
        "{st}"
    );

    let unauth = Raw {
        token: "nope".into(),
        ..raw
    };
    let (st, v) = unauth
        .call(Method::GET, &format!("/projects/{pid}/devices"), None)
        .await;
    assert_eq!(st, 401);
    assert_fits("error", &v, "components/schemas/Error.yaml");
}

/// The checker itself: it must catch what it is there to catch.
#[test]
fn the_checker_catches_mismatches() {
    let problems = |v: Value, schema: &str| {
        let mut errs = Vec::new();
        check(&v, &Schema::file(schema), "$", &mut errs);
        errs
    };
    let device = "components/schemas/Device.yaml";
    assert!(
        problems(
            serde_json::json!({"id": "0b0e3a8c-9f1c-4d7e-8a52-6a1f0e2d3c4b", "state": "active"}),
            device
        )
        .is_empty()
    );
    assert!(!problems(serde_json::json!({"id": "not-a-uuid"}), device).is_empty());
    assert!(!problems(serde_json::json!({"bogus_field": 1}), device).is_empty());
    assert!(!problems(serde_json::json!({"state": "exploding"}), device).is_empty());
    assert!(!problems(serde_json::json!({"tags": [1]}), device).is_empty());
    assert!(
        !problems(
            serde_json::json!({"ip_addresses": [{"address_family": "four"}]}),
            device
        )
        .is_empty()
    );
    assert!(!problems(serde_json::json!({"created_at": "yesterday"}), device).is_empty());
    // Nested through a $ref and an allOf.
    assert!(!problems(serde_json::json!({"metro": {"code": 7}}), device).is_empty());
    // Required properties of an allOf request body.
    let create = "components/schemas/DeviceCreateInMetroInput.yaml";
    assert!(
        !problems(
            serde_json::json!({"metro": "sv", "operating_system": "x"}),
            create
        )
        .is_empty()
    );
    assert!(
        problems(
            serde_json::json!({"metro": "sv", "operating_system": "x", "plan": "p"}),
            create
        )
        .is_empty()
    );
}
