// The placeholders of an engine command line (engine.command, `batonctl upgrade`, `batonctl
// fleet upgrade`), as Supervisor::Expand fills them in: {socket} {token} {role} {engine_id}
// {host} {port} {model_dir} {runtime_dir} (docs/operations.md, Engines). One list, so that a
// command holding any other {name} is refused where it is given, not by the engine it would
// launch. Plain functions.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace baton {

// The names, without braces, in the order the docs list them.
const std::vector<std::string>& EnginePlaceholders();

// InvalidArgument naming `what`, the word and the first {name} in `command` that is not one of
// EnginePlaceholders(), listing them. A {name} is letters, digits and '_' in braces, found as
// ExpandPlaceholders finds it; one right after a '$' is a shell's ${VAR} (a wrapper script's),
// and other braces (JSON such as {"level": 3}) hold no placeholder: both are left alone.
Status CheckPlaceholders(const std::vector<std::string>& command, const std::string& what);

}  // namespace baton
