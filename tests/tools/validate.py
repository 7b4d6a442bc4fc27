"""Validate Kubernetes objects offline against the schemas the API server enforces.

Kinds of the core API groups are checked against the OpenAPI schemas that the
kubernetes-validate package ships for a Kubernetes release, strictly (an unknown field
fails, as `kubectl apply --validate=strict` fails); the Prometheus Operator's kinds
(monitoring.coreos.com) against the openAPIV3Schema of the Operator's
CustomResourceDefinitions, made strict the same way. An object of a kind neither knows
fails too: nothing is skipped.

    python validate.py --crds DIR [--kubernetes-version 1.37] FILE...

Prints one line per object, `passed KIND/NAME` or `failed KIND/NAME: PATH: why`, and
exits 1 when any failed. Run it with the Python of tests/tools.sh's environment.
"""

import argparse
import copy
import os
import sys

import jsonschema
import kubernetes_validate
import yaml


def strict(schema):
    """The schema with additionalProperties: false wherever it lists properties and
    does not keep unknown fields, as the API server prunes and strict decoding refuses."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def crd_schemas(folder):
    """(apiVersion, kind) -> strict schema, from every CRD in `folder`."""
    found = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name)) as file:
            for crd in yaml.safe_load_all(file):
                if not crd or crd.get("kind") != "CustomResourceDefinition":
                    continue
                spec = crd["spec"]
                for version in spec["versions"]:
                    api_version = "%s/%s" % (spec["group"], version["name"])
                    schema = version["schema"]["openAPIV3Schema"]
                    found[(api_version, spec["names"]["kind"])] = strict(schema)
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crds", required=True)
    parser.add_argument("--kubernetes-version", default=kubernetes_validate.latest_version())
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()

    crds = crd_schemas(args.crds)
    failed = 0
    for path in args.files:
        with open(path) as file:
            objects = [obj for obj in yaml.safe_load_all(file) if obj]
        for obj in objects:
            name = "%s/%s" % (obj.get("kind"), (obj.get("metadata") or {}).get("name"))
            key = (obj.get("apiVersion"), obj.get("kind"))
            try:
                if key in crds:
                    jsonschema.Draft7Validator(crds[key]).validate(obj)
                    against = "the CRD of %s" % key[0]
                else:
                    version = kubernetes_validate.validate(obj, args.kubernetes_version, strict=True)
                    against = "Kubernetes %s" % version
                print("passed %s against %s" % (name, against))
            except jsonschema.ValidationError as error:
                where = ".".join(str(part) for part in error.absolute_path)
                print("failed %s: %s: %s" % (name, where, error.message))
                failed += 1
            except kubernetes_validate.SchemaNotFoundError:
                print("failed %s: no schema for %s %s" % (name, key[0], key[1]))
                failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
