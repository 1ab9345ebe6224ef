"""The zoo's conformance suite on ALiBi, one pytest test per applicable check."""

from zoo.testing import parametrize_with_checks


@parametrize_with_checks(["alibi"])
def test_conformance(variant, check):
    check(variant)
