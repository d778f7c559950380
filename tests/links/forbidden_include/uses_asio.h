// A header that check_links.cmake must refuse under forbidden_include_rule.txt: it includes
// Boost.Asio (the ctest link_rules_catch_a_forbidden_include). Never compiled.
#pragma once

#include <boost/asio.hpp>
