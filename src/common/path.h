#pragma once

#include <string>

namespace moat {

// Absolute and lexically normalised, never above "/":
// "/a//b/./c/../d" -> "/a/b/d", "../x" -> "/x". No file is looked at.
std::string normalizePath(const std::string& path);

}  // namespace moat
