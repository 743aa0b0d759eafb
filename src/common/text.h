#pragma once

#include <string>

namespace moat {

// ASCII letters lowered (host names, header names); other bytes as they are.
std::string asciiLower(std::string s);

}  // namespace moat
