"""schemathesis against the running API's ``/openapi.json``, over HTTP: property-based, bounded.

Every operation of the served schema gets at most 30 generated requests,
20 with valid inputs and 10 with invalid ones
(derandomized, so CI is repeatable), sent with a valid key of the role the operation needs (admin
for the admin endpoints, tenant otherwise) so they get past authentication.
Each response must not be a 5xx, must have a status, content type, headers
and body the schema declares, must refuse schema-violating input with a
4xx, and an operation must refuse a request without the key
(schemathesis' ``ignored_auth``).
"""

from __future__ import annotations

import hypothesis
import pytest
import schemathesis
from schemathesis import GenerationMode
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi import checks

VALID_EXAMPLES = 20
INVALID_EXAMPLES = 10
"""Generated requests per operation: 30 in all (the whole file stays under a minute)."""

ADMIN_PREFIXES = ("/v1/tenants", "/v1/keys", "/v1/status", "/v1/verify")

CHECKS = [
    schemathesis.checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
    checks.negative_data_rejection,
    checks.ignored_auth,
]


def _mutates_a_header(case) -> bool:
    data = case.meta.phase.data if case.meta is not None else None
    locations = {getattr(data, "parameter_location", None)}
    locations.update(m.parameter_location for m in getattr(data, "mutations", None) or ())
    return ParameterLocation.HEADER in locations


def _operations() -> list[tuple[str, str]]:
    """(METHOD, path) of every operation of the app's schema (built, not served, at collection)."""
    from scheduler.api.schema import document

    paths = document()["paths"]
    return [(method.upper(), path) for path, item in sorted(paths.items()) for method in sorted(item)]


NEGATIVE = (checks.negative_data_rejection,)


@pytest.fixture
def tokens(api):
    return {"admin": api.key(None, "admin"), "tenant": api.key("acme", "tenant")}


# schemathesis' own pytest loader (schemathesis.pytest.from_fixture) does not run under pytest 9
# (it sets a node attribute pytest 9 removed), so each operation is a parametrized test driving
# schemathesis' strategies with hypothesis directly: the same generation and checks.
@pytest.mark.parametrize(("method", "path"), _operations())
def test_no_5xx_and_every_response_conforms(api, tokens, method, path):
    schema = schemathesis.openapi.from_url(f"{api.url}/openapi.json")
    operation = schema[path][method]
    role = "admin" if path.startswith(ADMIN_PREFIXES) else "tenant"
    auth = {"Authorization": f"Bearer {tokens[role]}"}
    for mode, examples in ((GenerationMode.POSITIVE, VALID_EXAMPLES), (GenerationMode.NEGATIVE, INVALID_EXAMPLES)):

        @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
        @hypothesis.settings(
            max_examples=examples,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(hypothesis.HealthCheck),
            phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
        )
        def check(case):
            # The test sends the key itself, replacing a header schemathesis made invalid: such a
            # case is still checked for everything but its rejection (ignored_auth covers the key).
            header = mode is GenerationMode.NEGATIVE and _mutates_a_header(case)
            case.call_and_validate(headers=auth, checks=[c for c in CHECKS if not (header and c in NEGATIVE)])

        check()
