//! A small safe layer over the OpenVINO C API: the calls pyramid makes, each checked,
//! each handle freed by its owner. Thin on purpose: the `openvino` crate wraps more of the
//! API but not the non-variadic `_props` calls that runtime linking needs.

use std::ffi::{c_char, c_void, CStr, CString};
use std::ptr;

use openvino_sys as sys;

use crate::{library, OvError, Result};

fn check(call: &'static str, status: sys::ov_status_e) -> Result<()> {
    if status == sys::ov_status_e::OK {
        return Ok(());
    }
    // SAFETY: the library is loaded (every handle came from it); the message is a fresh
    // copy the caller owns and frees.
    let message = unsafe {
        let msg = sys::ov_get_last_err_msg();
        if msg.is_null() {
            format!("{status:?}")
        } else {
            let text = CStr::from_ptr(msg).to_string_lossy().trim().to_string();
            sys::ov_free(msg);
            text
        }
    };
    Err(OvError::Call { call, message })
}

fn c_string(s: &str) -> CString {
    // Names and properties are pyramid's or the user's text; an interior NUL cannot name
    // anything OpenVINO knows, so it is cut there.
    CString::new(s.split('\0').next().unwrap_or_default()).expect("no NUL left")
}

/// A copy of a string OpenVINO keeps (empty for null).
unsafe fn borrowed_string(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    CStr::from_ptr(p).to_string_lossy().into_owned()
}

/// Takes ownership of a string OpenVINO allocated.
unsafe fn owned_string(p: *mut c_char) -> String {
    let s = borrowed_string(p);
    if !p.is_null() {
        sys::ov_free(p);
    }
    s
}

/// The OpenVINO runtime: devices, model reading and compiling.
pub struct Core(*mut sys::ov_core_t);

// SAFETY: ov::Core is thread-safe for the calls used here (OpenVINO documents Core,
// CompiledModel and Tensor as usable from several threads).
unsafe impl Send for Core {}
unsafe impl Sync for Core {}

impl Core {
    pub fn new() -> Result<Self> {
        library::load()?;
        let mut core = ptr::null_mut();
        // SAFETY: out-pointer to a fresh handle.
        check("ov_core_create", unsafe { sys::ov_core_create(&mut core) })?;
        Ok(Self(core))
    }

    pub fn available_devices(&self) -> Result<Vec<String>> {
        let mut list = sys::ov_available_devices_t {
            devices: ptr::null_mut(),
            size: 0,
        };
        // SAFETY: the list is read then freed by its matching call.
        unsafe {
            check(
                "ov_core_get_available_devices",
                sys::ov_core_get_available_devices(self.0, &mut list),
            )?;
            let names = (0..list.size)
                .map(|i| borrowed_string(*list.devices.add(i)))
                .collect();
            sys::ov_available_devices_free(&mut list);
            Ok(names)
        }
    }

    /// A device property as text (`FULL_DEVICE_NAME`, `SUPPORTED_PROPERTIES`, …).
    pub fn device_property(&self, device: &str, key: &str) -> Result<String> {
        let (device, key) = (c_string(device), c_string(key));
        let mut value = ptr::null_mut();
        // SAFETY: valid C strings; the value is owned and freed by `owned_string`.
        unsafe {
            check(
                "ov_core_get_property",
                sys::ov_core_get_property(self.0, device.as_ptr(), key.as_ptr(), &mut value),
            )?;
            Ok(owned_string(value))
        }
    }

    /// Reads an IR model whose constants live in `weights`, which must outlive the model
    /// and everything compiled from it (OpenVINO shares, not copies, the buffer).
    pub fn read_model(&self, xml: &str, weights: &Tensor) -> Result<Model> {
        let mut model = ptr::null_mut();
        // SAFETY: the XML is passed with its length; `weights` is a live tensor.
        check("ov_core_read_model_from_memory_buffer", unsafe {
            sys::ov_core_read_model_from_memory_buffer(
                self.0,
                xml.as_ptr().cast(),
                xml.len(),
                weights.0,
                &mut model,
            )
        })?;
        Ok(Model(model))
    }

    pub fn compile(
        &self,
        model: &Model,
        device: &str,
        properties: &[(String, String)],
    ) -> Result<CompiledModel> {
        let device = c_string(device);
        let strings: Vec<(CString, CString)> = properties
            .iter()
            .map(|(k, v)| (c_string(k), c_string(v)))
            .collect();
        let props: Vec<sys::ov_property_t> = strings
            .iter()
            .map(|(k, v)| sys::ov_property_t {
                key: k.as_ptr(),
                value: v.as_ptr().cast(),
            })
            .collect();
        let mut compiled = ptr::null_mut();
        // SAFETY: `strings` outlives the call; the array length is passed.
        check("ov_core_compile_model_props", unsafe {
            sys::ov_core_compile_model_props(
                self.0,
                model.0,
                device.as_ptr(),
                props.len(),
                if props.is_empty() {
                    ptr::null()
                } else {
                    props.as_ptr()
                },
                &mut compiled,
            )
        })?;
        Ok(CompiledModel(compiled))
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        // SAFETY: owned handle, freed once.
        unsafe { sys::ov_core_free(self.0) }
    }
}

/// A model read from IR, before compiling.
pub struct Model(*mut sys::ov_model_t);

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: owned handle, freed once.
        unsafe { sys::ov_model_free(self.0) }
    }
}

pub struct CompiledModel(*mut sys::ov_compiled_model_t);

// SAFETY: see `Core`.
unsafe impl Send for CompiledModel {}
unsafe impl Sync for CompiledModel {}

impl CompiledModel {
    pub fn property(&self, key: &str) -> Result<String> {
        let key = c_string(key);
        let mut value = ptr::null_mut();
        // SAFETY: valid C string; the value is owned and freed by `owned_string`.
        unsafe {
            check(
                "ov_compiled_model_get_property",
                sys::ov_compiled_model_get_property(self.0, key.as_ptr(), &mut value),
            )?;
            Ok(owned_string(value))
        }
    }

    pub fn infer_request(&self) -> Result<InferRequest> {
        let mut request = ptr::null_mut();
        // SAFETY: out-pointer to a fresh handle.
        check("ov_compiled_model_create_infer_request", unsafe {
            sys::ov_compiled_model_create_infer_request(self.0, &mut request)
        })?;
        Ok(InferRequest(request))
    }
}

impl Drop for CompiledModel {
    fn drop(&mut self) {
        // SAFETY: owned handle, freed once.
        unsafe { sys::ov_compiled_model_free(self.0) }
    }
}

/// One inference context. Not shared: its owner serialises runs.
pub struct InferRequest(*mut sys::ov_infer_request_t);

// SAFETY: a request may move between threads; it is only used by one at a time (`&mut`).
unsafe impl Send for InferRequest {}

impl InferRequest {
    /// Binds `tensor` to the input or output named `name`. The request keeps its own
    /// reference to the tensor object, but host memory behind it must stay valid until
    /// the next `infer` has returned.
    pub fn set_tensor(&mut self, name: &str, tensor: &Tensor) -> Result<()> {
        let name = c_string(name);
        // SAFETY: live handles and a valid C string.
        check("ov_infer_request_set_tensor", unsafe {
            sys::ov_infer_request_set_tensor(self.0, name.as_ptr(), tensor.0)
        })
    }

    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        let name = c_string(name);
        let mut tensor = ptr::null_mut();
        // SAFETY: live handle; the tensor handle returned is owned by the caller.
        check("ov_infer_request_get_tensor", unsafe {
            sys::ov_infer_request_get_tensor(self.0, name.as_ptr(), &mut tensor)
        })?;
        Ok(Tensor(tensor))
    }

    /// The nodes the last inference executed, as `(node type, implementation, µs)`;
    /// empty unless the model was compiled with `PERF_COUNT=YES`.
    pub fn executed_nodes(&self) -> Result<Vec<(String, String, i64)>> {
        let mut list = sys::ov_profiling_info_list_t {
            profiling_infos: ptr::null_mut(),
            size: 0,
        };
        // SAFETY: live handle; the list is filled by OpenVINO and freed below, after its
        // strings were copied.
        unsafe {
            check(
                "ov_infer_request_get_profiling_info",
                sys::ov_infer_request_get_profiling_info(self.0, &mut list),
            )?;
            let infos = if list.profiling_infos.is_null() {
                &[][..]
            } else {
                std::slice::from_raw_parts(list.profiling_infos, list.size)
            };
            let nodes = infos
                .iter()
                .filter(|i| i.status == sys::ov_profiling_info_t_Status::EXECUTED)
                .map(|i| {
                    let (kind, exec) = (borrowed_string(i.node_type), borrowed_string(i.exec_type));
                    (kind, exec, i.real_time)
                })
                .collect();
            sys::ov_profiling_info_list_free(&mut list);
            Ok(nodes)
        }
    }

    pub fn infer(&mut self) -> Result<()> {
        // SAFETY: live handle; bound host memory is kept valid by the callers.
        check("ov_infer_request_infer", unsafe {
            sys::ov_infer_request_infer(self.0)
        })
    }
}

impl Drop for InferRequest {
    fn drop(&mut self) {
        // SAFETY: owned handle, freed once.
        unsafe { sys::ov_infer_request_free(self.0) }
    }
}

/// Element types pyramid's graphs use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Element {
    F32,
    I64,
    U8,
}

impl Element {
    fn sys(self) -> sys::ov_element_type_e {
        match self {
            Element::F32 => sys::ov_element_type_e::F32,
            Element::I64 => sys::ov_element_type_e::I64,
            Element::U8 => sys::ov_element_type_e::U8,
        }
    }
}

/// A tensor handle; either over caller memory ([`Tensor::over`]) or OpenVINO's own.
pub struct Tensor(*mut sys::ov_tensor_t);

// SAFETY: see `Core`.
unsafe impl Send for Tensor {}
unsafe impl Sync for Tensor {}

impl Tensor {
    /// A tensor viewing `data` without copying.
    ///
    /// # Safety
    /// `data` must hold `dims`' product of `element` values and stay valid (and not move)
    /// for as long as OpenVINO may read or write it through this tensor.
    pub unsafe fn over(element: Element, dims: &[usize], data: *mut c_void) -> Result<Self> {
        let dims: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        let mut shape = sys::ov_shape_t {
            rank: 0,
            dims: ptr::null_mut(),
        };
        check(
            "ov_shape_create",
            sys::ov_shape_create(dims.len() as i64, dims.as_ptr(), &mut shape),
        )?;
        let mut tensor = ptr::null_mut();
        let status = sys::ov_tensor_create_from_host_ptr(element.sys(), shape, data, &mut tensor);
        sys::ov_shape_free(&mut shape);
        check("ov_tensor_create_from_host_ptr", status)?;
        Ok(Self(tensor))
    }

    /// The tensor's f32 values (the caller knows its element type and size).
    pub fn as_f32(&self) -> Result<&[f32]> {
        let mut data = ptr::null_mut();
        let mut bytes = 0usize;
        // SAFETY: live handle; OpenVINO owns the memory for the tensor's lifetime, which
        // the returned slice borrows.
        unsafe {
            check("ov_tensor_data", sys::ov_tensor_data(self.0, &mut data))?;
            check(
                "ov_tensor_get_byte_size",
                sys::ov_tensor_get_byte_size(self.0, &mut bytes),
            )?;
            Ok(std::slice::from_raw_parts(data.cast::<f32>(), bytes / 4))
        }
    }
}

impl Drop for Tensor {
    fn drop(&mut self) {
        // SAFETY: owned handle, freed once.
        unsafe { sys::ov_tensor_free(self.0) }
    }
}
