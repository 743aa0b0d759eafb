#include "egress/host_name.h"

namespace moat::egress {

bool normalizeHostName(std::string_view name, std::string* out) {
  if (name.empty() || name.size() > kMaxHostName) return false;
  size_t label = 0;
  for (char c : name) {
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
    if (!ok) return false;
    if (c == '.') {
      if (label == 0) return false;  // leading dot or ".."
      label = 0;
    } else if (++label > kMaxLabel) {
      return false;
    }
  }
  if (label == 0) return false;  // trailing dot
  out->clear();
  out->reserve(name.size());
  for (char c : name) out->push_back(c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c);
  return true;
}

}  // namespace moat::egress
