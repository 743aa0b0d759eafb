#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

// An enum's stable names (stored, sent, shown) as one table of {value,
// name} that serves both directions. Each table's owner checks with a
// static_assert that it has a row for every value.
namespace moat {

template <class E>
struct EnumName {
  E value;
  const char* name;
};

template <class E, size_t N>
constexpr const char* nameIn(const EnumName<E> (&table)[N], E value, const char* otherwise) {
  for (const auto& row : table) {
    if (row.value == value) return row.name;
  }
  return otherwise;
}

template <class E, size_t N>
constexpr std::optional<E> valueNamed(const EnumName<E> (&table)[N], std::string_view name) {
  for (const auto& row : table) {
    if (name == row.name) return row.value;
  }
  return std::nullopt;
}

}  // namespace moat
