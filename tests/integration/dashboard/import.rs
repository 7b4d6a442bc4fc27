//! grafana.com's import flow: the data source input the dashboard declares, what it
//! requires, and what filling in the input leaves.

use super::{all_panels, datasource_variable, load_dashboard, panel_name, refers_to, targets};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Every string of `value`, with where it is.
fn strings<'a>(value: &'a Value, at: String, out: &mut Vec<(String, &'a str)>) {
    match value {
        Value::String(text) => out.push((at, text)),
        Value::Array(items) => {
            for (n, item) in items.iter().enumerate() {
                strings(item, format!("{at}[{n}]"), out);
            }
        }
        Value::Object(fields) => {
            for (key, item) in fields {
                strings(item, format!("{at}.{key}"), out);
            }
        }
        _ => {}
    }
}

/// A model, written here, of what Grafana's importer does with the inputs the user chose:
/// every `${NAME}` of a declared input is replaced in every string, and `__inputs` is
/// dropped. It is not Grafana's code: the test below checks the dashboard's side of the
/// import (every placeholder is a declared input, and the variable starts on it).
fn import(dashboard: &Value, inputs: &BTreeMap<&str, &str>) -> Value {
    match dashboard {
        Value::String(text) => {
            let mut text = text.clone();
            for (name, chosen) in inputs {
                text = text.replace(&format!("${{{name}}}"), chosen);
            }
            Value::String(text)
        }
        Value::Array(items) => {
            Value::Array(items.iter().map(|item| import(item, inputs)).collect())
        }
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .filter(|(key, _)| *key != "__inputs")
                .map(|(key, item)| (key.clone(), import(item, inputs)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[test]
fn dashboard_declares_its_data_source_input_and_what_it_requires() {
    let dashboard = load_dashboard();
    let inputs = dashboard["__inputs"].as_array().expect(
        "__inputs is missing: grafana.com's import flow asks for the data source through it",
    );
    assert_eq!(
        inputs.len(),
        1,
        "one input, the Prometheus data source: {inputs:#?}"
    );
    let input = &inputs[0];
    assert_eq!(input["name"], "DS_PROMETHEUS");
    assert_eq!(input["type"], "datasource");
    assert_eq!(input["pluginId"], "prometheus");
    assert!(input["label"]
        .as_str()
        .is_some_and(|label| !label.is_empty()));

    // Every ${DS_...} reference is a declared input, and the input is used.
    let mut all = Vec::new();
    strings(&dashboard, String::new(), &mut all);
    let references: Vec<&(String, &str)> = all
        .iter()
        .filter(|(at, text)| !at.starts_with(".__inputs") && text.contains("${DS_"))
        .collect();
    assert!(!references.is_empty(), "nothing uses ${{DS_PROMETHEUS}}");
    for (at, text) in &references {
        assert_eq!(*text, "${DS_PROMETHEUS}", "{at}");
    }

    // __requires: Grafana itself, the Prometheus data source, and exactly the panel types
    // the dashboard uses (rows are not plugins).
    let requires = dashboard["__requires"]
        .as_array()
        .expect("__requires is missing");
    let of_type = |kind: &str| -> BTreeSet<String> {
        requires
            .iter()
            .filter(|required| required["type"] == kind)
            .map(|required| required["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(of_type("grafana"), BTreeSet::from(["grafana".to_string()]));
    assert_eq!(
        of_type("datasource"),
        BTreeSet::from(["prometheus".to_string()])
    );
    let used: BTreeSet<String> = all_panels(&dashboard)
        .iter()
        .filter_map(|panel| panel["type"].as_str())
        .filter(|kind| *kind != "row")
        .map(str::to_string)
        .collect();
    assert_eq!(
        of_type("panel"),
        used,
        "__requires lists the panel types used"
    );
    for required in requires {
        assert!(required["name"].as_str().is_some(), "{required}");
        assert!(required["version"].as_str().is_some(), "{required}");
    }
    let grafana = requires
        .iter()
        .find(|required| required["type"] == "grafana")
        .unwrap();
    assert!(
        grafana["version"]
            .as_str()
            .is_some_and(|version| version.starts_with(char::is_numeric)),
        "{grafana}"
    );
}

#[test]
fn filling_in_the_ds_prometheus_input_leaves_no_placeholder_and_starts_the_variable_on_it() {
    let dashboard = load_dashboard();
    let imported = import(
        &dashboard,
        &BTreeMap::from([("DS_PROMETHEUS", "chosen-uid")]),
    );
    let mut all = Vec::new();
    strings(&imported, String::new(), &mut all);
    for (at, text) in &all {
        assert!(
            !text.contains("${DS_"),
            "{at} is left as {text} after the import"
        );
    }
    assert!(imported.get("__inputs").is_none());
    // The data source chosen at import is where the dashboard starts; panels keep going
    // through the variable, so the data source can still be switched afterwards (and a
    // provisioned copy, which no import rewrites, falls back to the default one).
    let variable = datasource_variable(&imported);
    let current = imported["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .find(|var| var["name"] == variable.as_str())
        .map(|var| &var["current"])
        .unwrap();
    assert_eq!(current["value"], "chosen-uid", "{current}");
    for panel in all_panels(&imported) {
        for target in targets(panel) {
            assert!(
                refers_to(&target["datasource"], &variable),
                "{}",
                panel_name(panel)
            );
        }
    }
}
