#pragma once

#include <string>

#include "api/validation.h"
#include "manager/process.h"

// How processes and their output look on the wire (docs/API.md).
namespace moat::api {

json processJson(const manager::ProcessInfo& info);
// One NDJSON event per output item: text that is valid UTF-8 travels as is,
// anything else (or everything, with forceBase64) as base64.
json outputEventJson(const manager::OutputItem& item, bool forceBase64);
// The event that ends a process's output: "exit" or "end" (with the reason).
json terminalEventJson(const manager::ProcessInfo& info);
// A signal by name ("TERM", "SIGTERM") or number (1-64); 0 when unknown.
int parseSignal(const json& j);
// What an input event says of `data`: its size and SHA-256, and the text
// itself when it is short (256 bytes at most) and printable UTF-8 (new
// lines and tabs included).
json inputJson(const std::string& data);

}  // namespace moat::api
