//! What the server serves: resource types, built in or defined by CRDs, and discovery documents.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

/// One served resource type (a group/resource with its served versions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceType {
    /// API group; empty for core.
    pub group: String,
    /// Served versions; the first is the preferred (storage) one.
    pub versions: Vec<String>,
    /// Plural resource name, as in URLs.
    pub plural: String,
    /// Singular name.
    pub singular: String,
    /// Kind of the objects.
    pub kind: String,
    /// Kind of lists.
    pub list_kind: String,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Short names (`kubectl get po`).
    pub short_names: Vec<String>,
    /// Categories (`kubectl get all`).
    pub categories: Vec<String>,
    /// Whether `/status` is a subresource (status written only through it).
    pub status_subresource: bool,
    /// Extra columns for `kubectl get`, as `(name, json path)`.
    pub printer_columns: Vec<(String, String)>,
    /// The structural schema (`openAPIV3Schema`) of each served version that has one which
    /// prunes (see [`crate::schema`]); versions without one store what they are given.
    pub schemas: BTreeMap<String, Arc<Value>>,
}

/// Identity of a resource type in storage and in the registry.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupResource {
    /// API group; empty for core.
    pub group: String,
    /// Plural resource name.
    pub resource: String,
}

impl GroupResource {
    /// `group/resource`, as stored.
    #[must_use]
    pub fn new(group: &str, resource: &str) -> Self {
        Self { group: group.to_string(), resource: resource.to_string() }
    }
}

impl ResourceType {
    /// The group/resource identity.
    #[must_use]
    pub fn gr(&self) -> GroupResource {
        GroupResource::new(&self.group, &self.plural)
    }

    /// `apiVersion` for a version of this type.
    #[must_use]
    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() { version.to_string() } else { format!("{}/{version}", self.group) }
    }

    /// Whether `version` is served.
    #[must_use]
    pub fn serves(&self, version: &str) -> bool {
        self.versions.iter().any(|v| v == version)
    }

    /// Built-in core/v1 Namespace type check.
    #[must_use]
    pub fn is_namespace(&self) -> bool {
        self.group.is_empty() && self.plural == "namespaces"
    }

    /// Whether objects of this type are custom resources (defined by a CRD), not built in.
    #[must_use]
    pub fn is_custom(&self) -> bool {
        !matches!(self.group.as_str(), "" | "coordination.k8s.io" | "apiextensions.k8s.io")
    }

    /// The CRD type check.
    #[must_use]
    pub fn is_crd(&self) -> bool {
        self.group == "apiextensions.k8s.io" && self.plural == "customresourcedefinitions"
    }

    /// The pruning schema of a version, if it has one.
    #[must_use]
    pub fn schema(&self, version: &str) -> Option<&Arc<Value>> {
        self.schemas.get(version)
    }

    /// Verbs for discovery.
    fn verbs() -> Value {
        json!(["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"])
    }

    fn discovery_entries(&self) -> Vec<Value> {
        let mut main = json!({
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": Self::verbs(),
        });
        if !self.short_names.is_empty() {
            main["shortNames"] = json!(self.short_names);
        }
        if !self.categories.is_empty() {
            main["categories"] = json!(self.categories);
        }
        let mut out = vec![main];
        if self.status_subresource {
            out.push(json!({
                "name": format!("{}/status", self.plural),
                "singularName": "",
                "namespaced": self.namespaced,
                "kind": self.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        out
    }

    /// Parse a CustomResourceDefinition object into the type it defines.
    ///
    /// # Errors
    /// A list of `(field, message)` causes naming each missing or invalid field.
    pub fn from_crd(crd: &Value) -> Result<Self, Vec<(String, String)>> {
        let mut causes = Vec::new();
        let spec = &crd["spec"];
        let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let group = s(&spec["group"]);
        let names = &spec["names"];
        let plural = s(&names["plural"]);
        let kind = s(&names["kind"]);
        if group.is_empty() {
            causes.push(("spec.group".into(), "Required value".into()));
        }
        if plural.is_empty() {
            causes.push(("spec.names.plural".into(), "Required value".into()));
        }
        if kind.is_empty() {
            causes.push(("spec.names.kind".into(), "Required value".into()));
        }
        let expected = format!("{plural}.{group}");
        let name = s(&crd["metadata"]["name"]);
        if !plural.is_empty() && !group.is_empty() && name != expected {
            causes.push((
                "metadata.name".into(),
                format!("Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group (\"{expected}\")"),
            ));
        }
        let scope = s(&spec["scope"]);
        let namespaced = match scope.as_str() {
            "Namespaced" => true,
            "Cluster" => false,
            other => {
                causes.push((
                    "spec.scope".into(),
                    format!("Unsupported value: \"{other}\": supported values: \"Cluster\", \"Namespaced\""),
                ));
                false
            }
        };
        let mut versions = Vec::new();
        let mut storage_first = None;
        let mut status_subresource = false;
        let mut printer_columns = Vec::new();
        let mut schemas = BTreeMap::new();
        match spec["versions"].as_array() {
            Some(list) if !list.is_empty() => {
                for v in list {
                    let vname = s(&v["name"]);
                    if vname.is_empty() {
                        causes.push(("spec.versions[].name".into(), "Required value".into()));
                        continue;
                    }
                    if v["served"].as_bool().unwrap_or(false) {
                        if v["storage"].as_bool().unwrap_or(false) {
                            storage_first = Some(vname.clone());
                        }
                        versions.push(vname.clone());
                    }
                    // A schema per version, else the top-level (v1beta1-style) one.
                    let schema = match &v["schema"]["openAPIV3Schema"] {
                        Value::Null => &spec["validation"]["openAPIV3Schema"],
                        s => s,
                    };
                    if schema.is_object() && !crate::schema::preserves_everything(schema) {
                        schemas.insert(vname.clone(), Arc::new(schema.clone()));
                    }
                    if v["subresources"]["status"].is_object() {
                        status_subresource = true;
                    }
                    if printer_columns.is_empty()
                        && let Some(cols) = v["additionalPrinterColumns"].as_array()
                    {
                        printer_columns = cols
                            .iter()
                            // Columns with a priority show only with `-o wide`; this server prints the default set.
                            .filter(|c| c["priority"].as_i64().unwrap_or(0) == 0)
                            .filter_map(|c| {
                                Some((c["name"].as_str()?.to_string(), c["jsonPath"].as_str()?.to_string()))
                            })
                            .collect();
                    }
                }
            }
            _ => causes.push(("spec.versions".into(), "Required value: must have at least one version".into())),
        }
        if let Some(storage) = storage_first {
            versions.retain(|v| *v != storage);
            versions.insert(0, storage);
        }
        if !causes.is_empty() {
            return Err(causes);
        }
        let strings = |v: &Value| -> Vec<String> {
            v.as_array().map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect()).unwrap_or_default()
        };
        let singular = match s(&names["singular"]) {
            x if x.is_empty() => kind.to_lowercase(),
            x => x,
        };
        let list_kind = match s(&names["listKind"]) {
            x if x.is_empty() => format!("{kind}List"),
            x => x,
        };
        Ok(Self {
            group,
            versions,
            plural,
            singular,
            kind,
            list_kind,
            namespaced,
            short_names: strings(&names["shortNames"]),
            categories: strings(&names["categories"]),
            status_subresource,
            printer_columns,
            schemas,
        })
    }
}

/// All served types, indexed for URL lookup. Cheap to clone (copy-on-write snapshots).
#[derive(Debug, Clone, Default)]
pub struct Registry {
    types: BTreeMap<GroupResource, Arc<ResourceType>>,
}

impl Registry {
    /// Add or replace a type.
    pub fn insert(&mut self, t: ResourceType) {
        self.types.insert(t.gr(), Arc::new(t));
    }

    /// Remove a type.
    pub fn remove(&mut self, gr: &GroupResource) {
        self.types.remove(gr);
    }

    /// Look up by group and plural; the version must be served.
    #[must_use]
    pub fn lookup(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.types.get(&GroupResource::new(group, plural)).filter(|t| t.serves(version)).cloned()
    }

    /// Every served type.
    pub fn all(&self) -> impl Iterator<Item = &Arc<ResourceType>> {
        self.types.values()
    }

    /// Look up by group/resource regardless of version.
    #[must_use]
    pub fn get(&self, gr: &GroupResource) -> Option<Arc<ResourceType>> {
        self.types.get(gr).cloned()
    }

    /// `/api`: the core versions.
    #[must_use]
    pub fn core_versions(&self, server_address: &str) -> Value {
        json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
        })
    }

    fn groups(&self) -> BTreeMap<&str, Vec<&str>> {
        let mut groups: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for t in self.types.values().filter(|t| !t.group.is_empty()) {
            let vs = groups.entry(t.group.as_str()).or_default();
            for v in &t.versions {
                if !vs.contains(&v.as_str()) {
                    vs.push(v);
                }
            }
        }
        groups
    }

    fn group_doc(name: &str, versions: &[&str]) -> Value {
        let vs: Vec<Value> =
            versions.iter().map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v})).collect();
        json!({ "name": name, "versions": vs, "preferredVersion": vs[0] })
    }

    /// `/apis`: every non-core group.
    #[must_use]
    pub fn group_list(&self) -> Value {
        let groups: Vec<Value> = self.groups().iter().map(|(g, vs)| Self::group_doc(g, vs)).collect();
        json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups })
    }

    /// `/apis/{group}`.
    #[must_use]
    pub fn group(&self, group: &str) -> Option<Value> {
        let groups = self.groups();
        let vs = groups.get(group)?;
        let mut doc = Self::group_doc(group, vs);
        doc["kind"] = json!("APIGroup");
        doc["apiVersion"] = json!("v1");
        Some(doc)
    }

    /// `/api/v1` or `/apis/{group}/{version}`.
    #[must_use]
    pub fn resource_list(&self, group: &str, version: &str) -> Option<Value> {
        let resources: Vec<Value> = self
            .types
            .values()
            .filter(|t| t.group == group && t.serves(version))
            .flat_map(|t| t.discovery_entries())
            .collect();
        if resources.is_empty() {
            return None;
        }
        let gv = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
        Some(json!({ "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources }))
    }
}
