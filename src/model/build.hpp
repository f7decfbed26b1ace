// Builds the Model of a job's [model] section.
#pragma once
#include "config/job.hpp"
#include "model/model.hpp"

namespace piper {

Model build_model(const ModelSpec& spec);

}  // namespace piper
