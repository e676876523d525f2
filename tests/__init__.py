"""SandBase's suites that drive it from outside with other people's clients (pytest), one
package: each suite a subpackage, what they share in `tests.support`."""
